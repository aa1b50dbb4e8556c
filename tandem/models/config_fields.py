"""Config fields an architecture cannot run without, checked before anything is built."""

from __future__ import annotations

from typing import Any


def require(cfg: Any, arch: str, *fields: str) -> None:
    """A clear error naming the first field `cfg` lacks (a config.json written for another
    model_type, e.g. a Granite checkpoint labelled "llama", has none of Granite's multipliers)."""
    for name in fields:
        if getattr(cfg, name, None) is None:
            model_type = getattr(cfg, "model_type", "?")
            raise ValueError(f"{arch} needs the config field {name!r}, which this config "
                             f"(model_type {model_type!r}) does not have. Add it to "
                             f"config.json, or check that model_type matches the architecture.")
