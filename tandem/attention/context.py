"""Scoped hand-off of attention metadata to the layers (no module-level mutable state)."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from tandem.attention.metadata import AttentionMetadata

_current: contextvars.ContextVar[AttentionMetadata | None] = contextvars.ContextVar(
    "tandem_attention_metadata", default=None)


@contextlib.contextmanager
def forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    if _current.get() is not None:
        raise RuntimeError("Nested forward_context is not allowed")
    token = _current.set(metadata)
    try:
        yield
    finally:
        _current.reset(token)


def get_forward_context() -> AttentionMetadata:
    meta = _current.get()
    if meta is None:
        raise RuntimeError("Attention layers run only inside forward_context(...)")
    return meta
