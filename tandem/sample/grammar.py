"""Grammar-constrained decoding on llguidance: compiling StructuredOutputsParams, and one matcher
per sequence that yields the allowed-token mask of each position.

llguidance computes a mask lazily from an Earley parser over the tokenizer's token trie, so a JSON
schema compiles in milliseconds even for Gemma's 262,144 tokens and a mask costs tens to hundreds
of microseconds (measured against outlines-core, whose index over the whole vocabulary takes
seconds to build per schema: see docs/performance.md). Compiled grammars are cached per spec; a
sequence's matcher is a cheap copy of the cached one.

With drafts, the masks of the k + 1 verified positions are computed by walking the matcher over
the drafts (a draft the grammar refuses ends the walk: it is rejected anyway) and rolling back.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any, Optional

import numpy as np
import torch

from tandem.sample.structured_params import StructuredOutputsParams

_CACHE_SIZE = 256
_REGEX_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}])")


def _grammar_text(spec: StructuredOutputsParams) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark  # (the package's name is the module)

    options = {"whitespace_flexible": not spec.disable_any_whitespace}
    kind = spec.kind
    if kind == "json":
        return LLMatcher.grammar_from_json_schema(spec.json, defaults=options)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=options)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        alternatives = "|".join(_REGEX_SPECIAL.sub(r"\\\1", c) for c in spec.choice)
        return LLMatcher.grammar_from_regex(f"({alternatives})")
    text = spec.grammar
    if "::=" in text:
        try:
            text = gbnf_to_lark(text)
        except Exception as e:  # noqa: BLE001 - llguidance raises a bare Exception here
            raise ValueError(f"not a valid GBNF grammar: {e}") from None
    return LLMatcher.grammar_from_lark(text)


class GrammarCompiler:
    """Per tokenizer: the llguidance tokenizer (built once, about a second for a large
    vocabulary) and a thread-safe LRU cache of compiled grammars (prototype matchers)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._llt: Optional[Any] = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _ll_tokenizer(self) -> Any:
        if self._llt is None:
            import llguidance.hf
            self._llt = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
        return self._llt

    def prototype(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of `spec` (compiling it on first use). Raises ValueError, naming
        the problem, for a grammar llguidance cannot compile."""
        from llguidance import LLMatcher

        key = spec.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            llt = self._ll_tokenizer()
        try:
            text = _grammar_text(spec)
        except ValueError as e:
            raise ValueError(f"structured_outputs.{spec.kind}: {e}") from None
        matcher = LLMatcher(llt, text, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{spec.kind} cannot be compiled: "
                             f"{matcher.get_error()}")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, prototype: Any, vocab_size: int) -> None:
        self.matcher = prototype.deep_copy()
        self.vocab_size = vocab_size

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (EOS once it is complete)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:self.vocab_size]
        return torch.from_numpy(bits.astype(bool))

    def masks(self, drafts: list[int]) -> torch.Tensor:
        """[len(drafts) + 1, V] bool: row j allows what may follow drafts[:j]. Rows past a draft
        the grammar refuses allow everything (they are never reached: that draft is rejected)."""
        rows = [self.allowed()]
        consumed = 0
        for d in drafts:
            if self.matcher.validate_tokens([d]) != 1:
                break
            self.matcher.consume_token(d)
            consumed += 1
            rows.append(self.allowed())
        if consumed:
            self.matcher.rollback(consumed)
        while len(rows) < len(drafts) + 1:
            rows.append(torch.ones(self.vocab_size, dtype=torch.bool))
        return torch.stack(rows)

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ValueError(f"token {token} does not fit the grammar: {self.matcher.get_error()}")

    def try_consume(self, token: int) -> bool:
        """Advance if the grammar allows `token` (the draft walks with its proposals)."""
        if self.matcher.validate_tokens([token]) != 1:
            return False
        return self.matcher.consume_token(token)

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)

    @property
    def finished(self) -> bool:
        """Complete and unable to continue: the sequence ends here."""
        return self.matcher.is_stopped()
