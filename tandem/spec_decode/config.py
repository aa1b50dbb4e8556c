"""SpeculativeConfig: vLLM's `speculative_config` keys, defaults and checks: a draft model
(`"draft_model"`), or a model-free method (`"ngram"`, `"suffix"`; their keys in
`model_free_config.py`).

Messages follow vLLM's wording where vLLM has one, so errors read the same after a switch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Optional, Union

from tandem.distributed.parallel_config import ParallelConfig
from tandem.loader.tokenizer import load_tokenizer
from tandem.model_config import ModelConfig
from tandem.attention.kv_format import check_kv_cache_dtype
from tandem.quantization import resolve_quantization
from tandem.sample.synthetic_sampler import rates_for_length
from tandem.spec_decode import model_free_config
from tandem.spec_decode.model_free_config import MODEL_FREE_METHODS

if TYPE_CHECKING:
    import torch

SUPPORTED_METHODS = ("draft_model", "ngram", "suffix")
# vLLM's other methods: recognised so the error can say "not supported" rather than "unknown".
VLLM_METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
                "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark")
# "auto" (tandem's, the default): probabilistic drafting for sampled requests, greedy for greedy
# ones. "probabilistic" does the same per row (a greedy request's q is one-hot at its argmax).
DRAFT_SAMPLE_METHODS = ("auto", "greedy", "probabilistic")
# "gumbel" (tandem's): drafter-invariant Gumbel-max coupling for every sampled request
# (sample/gumbel.py); on the TLI pair its acceptance is 6-10% below standard's. "auto" (tandem's,
# the default): "gumbel" for sampled requests with their own seed, so no drafting and no timing
# (adaptive k) can change their tokens, "standard" for the rest (docs/speculation.md).
REJECTION_METHODS = ("auto", "gumbel", "standard", "synthetic")
DEFAULT_REJECTION_METHOD = "auto"
# How a TLI draft sees a target token without a twin in its vocabulary (tandem's own key).
FEEDBACK_MODES = ("reencode", "unk")
MAX_SPEC_LEN = 128  # vLLM's rejection sampler bound
_DERIVED = ("draft_model_config", "uses_vocab_mapping")  # set by create(), not by users
logger = logging.getLogger("tandem")


@dataclass(frozen=True)
class SpeculativeConfig:
    model: Optional[str] = None
    num_speculative_tokens: Optional[int] = None
    method: Optional[str] = None
    draft_tensor_parallel_size: Optional[int] = None
    max_model_len: Optional[int] = None
    revision: Optional[str] = None
    # vLLM's key: how the draft's weights are quantized (tandem/quantization.py's values)
    quantization: Optional[str] = None
    # vLLM's key: the draft's own KV cache format (attention/kv_format.py; None: the target's)
    kv_cache_dtype: Optional[str] = None
    draft_sample_method: str = "auto"
    use_heterogeneous_vocab: bool = False
    heterogeneous_vocab_feedback: str = "reencode"
    # tandem's own: choose the number of drafts every step, 0..num_speculative_tokens, from
    # measured acceptance and costs (spec_decode/adaptive.py), calibrated at load
    # (engine/calibration.py). On by default: within 5% of plain with a useless draft and of the
    # best fixed k (docs/speculation.md); seeded requests cannot depend on it under "auto".
    adaptive: bool = True
    # Benchmarking only, not lossless (sample/synthetic_sampler.py), as in vLLM.
    rejection_sample_method: str = DEFAULT_REJECTION_METHOD
    synthetic_acceptance_rates: Optional[list[float]] = None
    synthetic_acceptance_length: Optional[float] = None
    # vLLM's dynamic speculative decoding: [[start, end, k], ...] inclusive batch-size ranges;
    # k is capped to the range's value at that many running requests (schedule.py).
    num_speculative_tokens_per_batch_size: Optional[list] = None
    # method "ngram" (vLLM's keys): the longest match of the last prompt_lookup_max ..
    # prompt_lookup_min tokens proposes what followed it (spec_decode/ngram.py)
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None
    # method "suffix" (vLLM's keys; defaults 24, 10000, 1.0, 0.1 under that method only)
    suffix_decoding_max_tree_depth: Optional[int] = None
    suffix_decoding_max_cached_requests: Optional[int] = None
    suffix_decoding_max_spec_factor: Optional[float] = None
    suffix_decoding_min_token_prob: Optional[float] = None
    # tandem's: "ngram" or "suffix" beside the draft model, or "none"; left out, "ngram" with
    # LOOKAHEAD_NGRAM's keys where the draft shares the target's vocabulary (_with_draft)
    lookup_method: Optional[str] = None
    # vLLM's keys with nothing to act on here (no CUDA graphs; no remote model code): accepted
    # and logged.
    enforce_eager: Optional[bool] = None
    code_revision: Optional[str] = None
    # Filled by create(): the draft's resolved model config, and whether the draft's tokenizer
    # differs from the target's (then drafting goes through the TLI vocabulary mapping).
    draft_model_config: Optional[Any] = None
    uses_vocab_mapping: bool = False

    @property
    def model_free(self) -> bool:
        """Drafts come from the request's own tokens (ngram, suffix), not from a draft model."""
        return self.method in MODEL_FREE_METHODS

    @property
    def draft_max_model_len(self) -> int:
        """Longest context the draft drafts at, in its own positions (vLLM: drafting stops past
        speculative max_model_len, by default the smaller of the two models' lengths; a
        model-free method's is the target's unless given)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.draft_model_config.max_model_len

    @staticmethod
    def create(raw: Union[dict, SpeculativeConfig], target: ModelConfig,
               parallel: ParallelConfig, device: torch.device) -> SpeculativeConfig:
        if isinstance(raw, SpeculativeConfig):
            raw = {f.name: getattr(raw, f.name) for f in fields(raw) if f.name not in _DERIVED}
        if not isinstance(raw, dict):
            raise ValueError("speculative_config must be a dict or a SpeculativeConfig, got "
                             f"{type(raw).__name__}.")
        raw = {str(k).replace("-", "_"): v for k, v in raw.items()}
        if "tensor_parallel_size" in raw:
            raise ValueError("'tensor_parallel_size' is not a valid argument in the "
                             "speculative_config. Please pass 'draft_tensor_parallel_size' instead.")
        allowed = [f.name for f in fields(SpeculativeConfig) if f.name not in _DERIVED]
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise ValueError(f"Unknown key(s) {unknown} in speculative_config; supported keys: "
                             f"{allowed}.")
        _check_types(raw)
        raw = model_free_config.resolve(raw)
        cfg = SpeculativeConfig(**raw)
        cfg._verify(parallel)
        if cfg.model_free:
            return cfg._without_draft(target)
        return cfg._with_draft(target, device)

    def _verify(self, parallel: ParallelConfig) -> None:
        method = self.method
        if self.use_heterogeneous_vocab is True and method not in (None, "draft_model"):
            raise ValueError("use_heterogeneous_vocab only works with method='draft_model', got "
                             f"method={method!r}.")
        if method is None and self.model is None:
            if self.num_speculative_tokens is not None:
                raise ValueError("num_speculative_tokens was provided but without speculative model.")
            raise ValueError("speculative_config needs 'model' (the draft model) for "
                             "method='draft_model'.")
        if method is not None and method not in SUPPORTED_METHODS:
            what = ("is not supported by tandem" if method in VLLM_METHODS
                    else "is unknown")
            raise ValueError(f"Unsupported speculative method: '{method}' {what}; supported "
                             f"methods: {list(SUPPORTED_METHODS)}.")
        if self.model_free:
            self._verify_common()
            return
        if self.model is None:
            raise ValueError("speculative_config['model'] is required for method='draft_model'.")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"speculative_config['model'] must be a non-empty string, got "
                             f"{self.model!r}.")
        self._verify_common()
        tp = self.draft_tensor_parallel_size
        if tp is not None and tp not in (1, parallel.tensor_parallel_size):
            raise ValueError(f"speculative_draft_tensor_parallel_size={tp} cannot be other value "
                             "than 1 or target model tensor_parallel_size")
        self._log_no_effect()
        if not isinstance(self.use_heterogeneous_vocab, bool):
            raise ValueError("use_heterogeneous_vocab must be true or false, got "
                             f"{self.use_heterogeneous_vocab!r}.")
        if self.heterogeneous_vocab_feedback not in FEEDBACK_MODES:
            raise ValueError("heterogeneous_vocab_feedback must be one of "
                             f"{list(FEEDBACK_MODES)}, got {self.heterogeneous_vocab_feedback!r}.")
        if self.kv_cache_dtype is not None:
            check_kv_cache_dtype(self.kv_cache_dtype, "speculative_config['kv_cache_dtype']")

    def _verify_common(self) -> None:
        """The checks every method shares: k, sampling methods, schedule, adaptive, length."""
        k = self.num_speculative_tokens
        if k is None:
            raise ValueError("A speculative model was provided, but `num_speculative_tokens` was "
                             "not provided")
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({k}).")
        if k > MAX_SPEC_LEN:
            raise ValueError(f"num_speculative_tokens must be at most {MAX_SPEC_LEN}, got {k}.")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(f"draft_sample_method must be one of {list(DRAFT_SAMPLE_METHODS)}, "
                             f"got {self.draft_sample_method!r}.")
        self._verify_synthetic()
        if self.num_speculative_tokens_per_batch_size is not None:
            from tandem.spec_decode.schedule import validate_schedule
            validate_schedule(self.num_speculative_tokens_per_batch_size, k)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}.")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int)
                                               or self.max_model_len < 1):
            raise ValueError("speculative_config['max_model_len'] must be a positive integer, got "
                             f"{self.max_model_len!r}.")

    def _log_no_effect(self) -> None:
        if self.enforce_eager is not None:
            if not isinstance(self.enforce_eager, bool):
                raise ValueError(f"speculative_config['enforce_eager'] must be true or false, got "
                                 f"{self.enforce_eager!r}.")
            logger.info("speculative_config['enforce_eager']=%s has no effect in tandem: the "
                        "draft always runs eagerly (only the target's steps are graphed).",
                        self.enforce_eager)
        if self.code_revision is not None:
            if not isinstance(self.code_revision, str):
                raise ValueError("speculative_config['code_revision'] must be a string, got "
                                 f"{self.code_revision!r}.")
            logger.info("speculative_config['code_revision']=%r has no effect in tandem: it "
                        "runs its own model code, never code from the model's repository.",
                        self.code_revision)

    def _verify_synthetic(self) -> None:
        method, k = self.rejection_sample_method, self.num_speculative_tokens
        if method not in REJECTION_METHODS:
            what = "is not supported by tandem" if method in ("block", "fly") else "is unknown"
            raise ValueError(f"rejection_sample_method {method!r} {what}; supported: "
                             f"{list(REJECTION_METHODS)}.")
        rates, length = self.synthetic_acceptance_rates, self.synthetic_acceptance_length
        if method != "synthetic":
            if rates is not None or length is not None:
                raise ValueError("synthetic_acceptance_rates and synthetic_acceptance_length are "
                                 "only valid with rejection_sample_method='synthetic'.")
            return
        if (rates is None) == (length is None):
            raise ValueError("rejection_sample_method='synthetic' needs exactly one of "
                             "synthetic_acceptance_rates or synthetic_acceptance_length.")
        if rates is not None:
            if not isinstance(rates, list) or len(rates) != k or not all(
                    isinstance(r, (int, float)) and not isinstance(r, bool) and 0 <= r <= 1
                    for r in rates):
                raise ValueError(f"synthetic_acceptance_rates must be a list of {k} numbers in "
                                 f"[0, 1] (one per draft position), got {rates!r}.")
            if any(b > a for a, b in zip(rates, rates[1:])):
                raise ValueError("synthetic_acceptance_rates must be non-increasing, got "
                                 f"{rates!r}.")
        elif not isinstance(length, (int, float)) or isinstance(length, bool) \
                or not 1 <= length <= k + 1:
            raise ValueError(f"synthetic_acceptance_length must be in [1, {k + 1}], got "
                             f"{length!r}.")
        logger.warning("rejection_sample_method='synthetic': drafts are accepted at set rates, "
                       "whatever the target says; the output is NOT the target's distribution "
                       "(benchmarking only).")

    def acceptance_rates(self) -> Optional[list[float]]:
        """Synthetic per-position acceptance rates, or None for real verification."""
        if self.rejection_sample_method != "synthetic":
            return None
        if self.synthetic_acceptance_rates is not None:
            return [float(r) for r in self.synthetic_acceptance_rates]
        return rates_for_length(float(self.synthetic_acceptance_length),
                                self.num_speculative_tokens)

    def _without_draft(self, target: ModelConfig) -> SpeculativeConfig:
        """A model-free method drafts in the target's own positions, up to its length."""
        if self.max_model_len is not None and self.max_model_len > target.max_model_len:
            raise ValueError(f"speculative_max_model_len={self.max_model_len} cannot be "
                             f"larger than target_max_model_len={target.max_model_len}")
        return replace(self, max_model_len=self.max_model_len or target.max_model_len)

    def _with_draft(self, target: ModelConfig, device: torch.device) -> SpeculativeConfig:
        # The draft inherits dtype and seed from the target (as in vLLM).
        draft = ModelConfig.create(self.model, None, target.dtype, None, target.seed,
                                   self.revision, device, field_prefix="speculative_config.",
                                   load_format=target.load_format)
        draft = replace(draft, quantization=resolve_quantization(
            self.quantization, draft.gguf_file, draft.dtype, device,
            self.draft_tensor_parallel_size or 1, field="speculative_config.quantization"))
        if self.max_model_len is not None:
            if self.max_model_len > draft.max_model_len:
                raise ValueError(f"speculative_max_model_len={self.max_model_len} cannot be "
                                 f"larger than draft_max_model_len={draft.max_model_len}")
            if self.max_model_len > target.max_model_len:
                raise ValueError(f"speculative_max_model_len={self.max_model_len} cannot be "
                                 f"larger than target_max_model_len={target.max_model_len}")
        target_tok = load_tokenizer(target)
        try:
            draft_tok = load_tokenizer(draft)
        except Exception as e:  # noqa: BLE001 - any loader failure gets the same clear message
            raise ValueError(
                f"Could not load the draft's tokenizer for speculative_config['model']="
                f"{self.model!r} (from {draft.tokenizer}): {type(e).__name__}: {e}. The draft "
                "needs its own tokenizer files (tokenizer.json or a GGUF vocabulary), so its "
                "tokens can be compared with the target's.") from e
        same = same_tokenizer(target_tok, draft_tok)
        if not same and not self.use_heterogeneous_vocab:
            raise ValueError(
                "Target and draft model should have the same vocabulary. Target model "
                f"vocab_size={target.vocab_size} ({len(target_tok)} tokens in its tokenizer). "
                f"Draft model vocab_size={draft.vocab_size} ({len(draft_tok)} tokens in its "
                "tokenizer). Using models with different tokenizers needs "
                "\"use_heterogeneous_vocab\": true in speculative_config.")
        if self.use_heterogeneous_vocab and same:
            logger.info("use_heterogeneous_vocab: the draft shares the target's tokenizer, so "
                        "drafting needs no vocabulary mapping.")
        lookahead = {}
        if self.lookup_method is None and same:  # the default: an n-gram lookahead
            lookahead = {"lookup_method": "ngram", **model_free_config.LOOKAHEAD_NGRAM}
        return SpeculativeConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)
                                       if f.name not in _DERIVED}, **lookahead},
                                 draft_model_config=draft, uses_vocab_mapping=not same)


# Keys whose values must be integers (JSON from a command line often quotes them: "5").
_INT_KEYS = ("num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len")


def _check_types(raw: dict) -> None:
    for key in _INT_KEYS:
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"speculative_config['{key}'] must be an integer, got {value!r} "
                             f"({type(value).__name__}).")


def same_tokenizer(a: Any, b: Any) -> bool:
    """Same token strings at the same ids (config vocab sizes may differ by padding)."""
    return len(a) == len(b) and a.get_vocab() == b.get_vocab()
