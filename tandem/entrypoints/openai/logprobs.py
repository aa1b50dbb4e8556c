"""Engine logprobs -> the two OpenAI JSON formats: legacy completions (`tokens`, `token_logprobs`,
`top_logprobs` as {token: logprob} dicts, `text_offset`) and chat (`content: [{token, logprob,
bytes, top_logprobs}]`).

JSON has no -inf or NaN, and clients choke on them, so every value is clamped to -9999.0 as vLLM
does.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from tandem.outputs import Logprob

MIN_LOGPROB = -9999.0

PositionLogprobs = Optional[dict[int, Logprob]]


def clamp(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if math.isnan(value) or value < MIN_LOGPROB:
        return MIN_LOGPROB
    return float(value)


def token_id_text(token_id: int) -> str:
    """vLLM's return_tokens_as_token_ids spelling (for tokens that are no valid text alone)."""
    return f"token_id:{token_id}"


def prompt_logprobs_json(tokenizer: Any, logprobs: Optional[Sequence[PositionLogprobs]],
                         as_token_ids: bool = False) -> Optional[list]:
    """vLLM's `prompt_logprobs`: per prompt position, None or {token id: {logprob, rank,
    decoded_token}}."""
    if logprobs is None:
        return None
    return [None if entry is None else {
        str(tid): {"logprob": clamp(lp.logprob), "rank": lp.rank,
                   "decoded_token": token_id_text(tid) if as_token_ids
                   else token_text(tokenizer, tid, lp)}
        for tid, lp in _by_rank(entry)} for entry in logprobs]


def token_text(tokenizer: Any, token_id: int, lp: Optional[Logprob] = None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id])


def _by_rank(entry: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(entry.items(), key=lambda kv: (kv[1].rank is None, kv[1].rank or 0,
                                                 -kv[1].logprob))


def _unique_keys(tokenizer: Any, ranked: list[tuple[int, Logprob]]) -> dict[int, str]:
    """{token: logprob} dicts lose entries when two tokens decode alike (partial UTF-8 bytes all
    decode to U+FFFD), so a repeated text falls back to the vocabulary's own spelling."""
    keys: dict[int, str] = {}
    used: set[str] = set()
    for tid, lp in ranked:
        text = token_text(tokenizer, tid, lp)
        if text in used:
            text = str(tokenizer.convert_ids_to_tokens(tid))
        keys[tid] = text
        used.add(text)
    return keys


class CompletionLogprobs:
    """Accumulates the legacy format; `text_offset` continues across calls, so streamed chunks
    get the same offsets as one non-streamed response."""

    def __init__(self, tokenizer: Any, initial_offset: int = 0,
                 as_token_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.offset = initial_offset
        self.as_token_ids = as_token_ids

    def build(self, token_ids: Sequence[int],
              logprobs: Sequence[PositionLogprobs]) -> dict[str, list]:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}
        for i, token_id in enumerate(token_ids):
            entry = logprobs[i] if i < len(logprobs) else None
            chosen = entry.get(token_id) if entry else None
            ranked = _by_rank(entry) if entry else []
            keys = _unique_keys(self.tokenizer, ranked)
            # The chosen token is spelled as in top_logprobs, so clients can compare the two.
            text = keys.get(token_id) or token_text(self.tokenizer, token_id, chosen)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if self.as_token_ids:
                keys = {tid: token_id_text(tid) for tid in keys}
                text = token_id_text(token_id)
            out["tokens"].append(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(clamp(chosen.logprob) if chosen else None)
            out["top_logprobs"].append({keys[tid]: clamp(lp.logprob) for tid, lp in ranked})
        return out


def merge_completion_logprobs(parts: Sequence[dict[str, list]]) -> dict[str, list]:
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
    for part in parts:
        for key in merged:
            merged[key].extend(part[key])
    return merged


def chat_logprobs(tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[PositionLogprobs],
                  top_logprobs: int, as_token_ids: bool = False) -> list[dict[str, Any]]:
    """The `content` list of a chat choice's logprobs; exactly `top_logprobs` alternatives."""
    content: list[dict[str, Any]] = []
    for i, token_id in enumerate(token_ids):
        entry = (logprobs[i] if i < len(logprobs) else None) or {}
        chosen = entry.get(token_id)
        text = token_id_text(token_id) if as_token_ids else token_text(tokenizer, token_id, chosen)
        alternatives = []
        for tid, lp in _by_rank(entry)[:top_logprobs]:
            alt = token_id_text(tid) if as_token_ids else token_text(tokenizer, tid, lp)
            alternatives.append({"token": alt, "logprob": clamp(lp.logprob),
                                 "bytes": list(alt.encode("utf-8"))})
        content.append({"token": text,
                        "logprob": clamp(chosen.logprob) if chosen else MIN_LOGPROB,
                        "bytes": list(text.encode("utf-8")), "top_logprobs": alternatives})
    return content
