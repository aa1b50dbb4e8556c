"""StructuredOutputsParams: what a request's output must match (vLLM's fields and names)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: Optional[Union[str, dict]] = None       # a JSON schema (object or its text)
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None                 # Lark, or GBNF/EBNF (rules written `::=`)
    json_object: Optional[bool] = None            # any JSON object
    whitespace_pattern: Optional[str] = None      # vLLM's guided_whitespace_pattern: refused
    disable_any_whitespace: bool = False          # JSON without free whitespace

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of "
                             f"{list(KINDS)}; got {given or 'none'}.")
        if self.json is not None and isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError("structured_outputs.json must be a JSON schema object.")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of non-empty "
                             "strings.")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string.")
        if self.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern (guided_whitespace_pattern) "
                             "is not supported; use disable_any_whitespace for compact JSON.")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> str:
        """A stable text for caching compiled grammars."""
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutputsParams:
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"Unknown structured_outputs field(s) {unknown}; supported: "
                             f"{sorted(allowed)}.")
        return cls(**data)
