"""The keys of the model-free methods, `"ngram"` (prompt lookup) and `"suffix"` (suffix
decoding): which method a raw speculative_config asks for, their defaults and their checks.

vLLM's keys, defaults and messages: `prompt_lookup_min`/`prompt_lookup_max` (both 5 when neither
is given, one copies the other), `suffix_decoding_max_tree_depth` (24),
`suffix_decoding_max_cached_requests` (10000), `suffix_decoding_max_spec_factor` (1.0),
`suffix_decoding_min_token_prob` (0.1); a suffix config without `num_speculative_tokens` drafts
up to the tree depth, as vLLM's does. A key of one method given to another is an error, and so
are the draft model's keys without a draft model: nothing a user sends is silently ignored.

`lookup_method` (tandem's key, with `method: "draft_model"`) runs a lookup beside the draft
model: as the draft's lookahead (sparing its passes where its tokens equal the lookup's), or
with a TLI draft, a request whose lookup finds a match verifies its proposal, the others the
draft's (`spec_decode/combined.py`). The lookup's own keys then apply as under its method.
Left out, a draft of the target's vocabulary gets an n-gram lookahead (`LOOKAHEAD_NGRAM`): it
never changes a draft, only spares passes; `"none"` turns it off.
"""

from __future__ import annotations

from typing import Any

MODEL_FREE_METHODS = ("ngram", "suffix")
NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
SUFFIX_DEFAULTS: dict[str, Any] = {
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}
NGRAM_DEFAULT_LOOKUP = 5
LOOKUP_OFF = "none"  # lookup_method: the draft model alone, without its default lookahead
# The lookahead a draft of the target's vocabulary gets when lookup_method is left out: n-grams
# of 2 to 5 tokens (1 measured worse alone: its one-token matches cost rows; docs/speculation.md).
LOOKAHEAD_NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
# Keys that describe a draft model: meaningless for a model-free method.
DRAFT_MODEL_KEYS = ("revision", "quantization", "kv_cache_dtype", "draft_tensor_parallel_size",
                    "heterogeneous_vocab_feedback", "code_revision", "enforce_eager")


def infer_method(raw: dict) -> Any:
    """vLLM's rule: no method and a model named "ngram" or "[ngram]" means ngram; "[suffix]"
    likewise here. Anything else without a method is a draft model."""
    method, model = raw.get("method"), raw.get("model")
    if method is None and model in ("ngram", "[ngram]", "suffix", "[suffix]"):
        return model.strip("[]")
    if method == "[ngram]":
        return "ngram"
    return method


def resolve(raw: dict) -> dict:
    """The raw config (keys already normalised) with the model-free keys checked and their
    defaults filled in for its method (or for `lookup_method`, a lookup beside a draft model);
    unchanged but for those checks otherwise."""
    raw = dict(raw)
    method = infer_method(raw)
    if method is not None:
        raw["method"] = method
    lookup = _lookup_method(raw, method)
    for own, keys in (("ngram", NGRAM_KEYS), ("suffix", tuple(SUFFIX_DEFAULTS))):
        for key in keys:
            if raw.get(key) is not None and lookup != own:
                raise ValueError(f"speculative_config['{key}'] is only valid with method="
                                 f"'{own}' (or lookup_method='{own}'), got method={method!r}.")
    if lookup is not None and method not in MODEL_FREE_METHODS:
        _resolve_lookup_keys(raw, lookup)  # beside a draft model, whose checks follow
        return raw
    if method not in MODEL_FREE_METHODS:
        return raw
    if raw.get("use_heterogeneous_vocab"):
        raise ValueError(f"use_heterogeneous_vocab only works with method='draft_model', got "
                         f"method={method!r}.")
    model = raw.pop("model", None)
    if model not in (None, method, f"[{method}]"):
        raise ValueError(f"speculative_config['model'] names a draft model, but method="
                         f"{method!r} drafts without one; leave 'model' out (or use "
                         "method='draft_model').")
    for key in DRAFT_MODEL_KEYS:
        if raw.get(key) is not None:
            raise ValueError(f"speculative_config['{key}'] is a draft model's setting; method="
                             f"{method!r} has no draft model.")
    if raw.get("draft_sample_method") == "probabilistic":  # a lookup has no q to sample from
        raise ValueError(f"draft_sample_method='probabilistic' needs a draft model's "
                         f"distribution; method={method!r} proposes point guesses ('auto' or "
                         "'greedy').")
    _resolve_lookup_keys(raw, method)
    if raw.get("num_speculative_tokens") is None:
        if method == "ngram":
            raise ValueError("method='ngram' needs num_speculative_tokens (the most tokens one "
                             "lookup proposes).")
        raw["num_speculative_tokens"] = raw["suffix_decoding_max_tree_depth"]  # as vLLM's
    return raw


def _lookup_method(raw: dict, method: Any) -> Any:
    """The lookup this config runs: its method if model-free, else `lookup_method` (tandem's
    key: a lookup's proposals where it finds a match, the draft model's elsewhere)."""
    lookup = raw.get("lookup_method")
    if lookup is None:
        return method if method in MODEL_FREE_METHODS else None
    if lookup not in (*MODEL_FREE_METHODS, LOOKUP_OFF):
        raise ValueError(f"speculative_config['lookup_method'] must be one of "
                         f"{[*MODEL_FREE_METHODS, LOOKUP_OFF]}, got {lookup!r}.")
    if method not in (None, "draft_model"):
        raise ValueError(f"speculative_config['lookup_method'] adds a lookup beside a draft "
                         f"model (method='draft_model'), got method={method!r}.")
    return None if lookup == LOOKUP_OFF else lookup


def _resolve_lookup_keys(raw: dict, lookup: str) -> None:
    if lookup == "ngram":
        _resolve_ngram(raw)
    else:
        _resolve_suffix(raw)


def _int_at_least(raw: dict, key: str, low: int) -> int:
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"speculative_config['{key}'] must be an integer >= {low}, got "
                         f"{value!r}.")
    return value


def _resolve_ngram(raw: dict) -> None:
    for key in NGRAM_KEYS:  # the values given, checked before one copies the other
        if raw.get(key) is not None:
            _int_at_least(raw, key, 1)
    lo, hi = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
    if lo is None and hi is None:
        lo = hi = NGRAM_DEFAULT_LOOKUP
    lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
    raw["prompt_lookup_min"], raw["prompt_lookup_max"] = lo, hi
    if lo > hi:
        raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")


def _resolve_suffix(raw: dict) -> None:
    for key, default in SUFFIX_DEFAULTS.items():
        if raw.get(key) is None:
            raw[key] = default
    _int_at_least(raw, "suffix_decoding_max_tree_depth", 1)
    _int_at_least(raw, "suffix_decoding_max_cached_requests", 0)
    factor = raw["suffix_decoding_max_spec_factor"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ValueError("speculative_config['suffix_decoding_max_spec_factor'] must be a number "
                         f"> 0, got {factor!r}.")
    prob = raw["suffix_decoding_min_token_prob"]
    if not isinstance(prob, (int, float)) or isinstance(prob, bool) or not 0 <= prob <= 1:
        raise ValueError("speculative_config['suffix_decoding_min_token_prob'] must be a number "
                         f"in [0, 1], got {prob!r}.")
