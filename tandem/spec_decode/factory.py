"""Builds the draft proposer for a speculative config (same-vocabulary or TLI inputs), and the
verifier and plain sampler its rejection_sample_method asks for."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from tandem.config import EngineConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.loader.tokenizer import load_tokenizer
from tandem.sample.gumbel_verifier import AutoRejectionSampler, GumbelRejectionSampler
from tandem.sample.rejection_sampler import RejectionSampler
from tandem.sample.sampler import Sampler
from tandem.sample.synthetic_sampler import SyntheticRejectionSampler
from tandem.spec_decode.config import DEFAULT_REJECTION_METHOD, SpeculativeConfig
from tandem.spec_decode.draft_feedback import TargetToDraft
from tandem.spec_decode.draft_inputs import SharedVocabDraft, TLIDraft
from tandem.spec_decode.proposer import DraftProposer
from tandem.spec_decode.vocab_mapping import get_vocab_mapping
from tandem.worker.model_runner import ForwardBatch

ModelForward = Callable[[ForwardBatch, torch.Tensor], torch.Tensor]


def build_proposer(config: EngineConfig, forward: ModelForward, kv: KVCacheManager,
                   device: torch.device) -> DraftProposer:
    spec = config.speculative_config
    target, draft = config.model_config, spec.draft_model_config
    # "auto" and "probabilistic" both draft each row from its own distribution (one-hot for a
    # greedy request); the rows the rejection method couples (every sampled row under
    # "gumbel", seeded sampled rows under "auto") with the noise the target's token reads.
    probabilistic = spec.draft_sample_method in ("auto", "probabilistic")
    method = spec.rejection_sample_method
    if spec.uses_vocab_mapping:
        target_tok, draft_tok = load_tokenizer(target), load_tokenizer(draft)
        key = (target.tokenizer, target.revision, draft.tokenizer, draft.revision)
        mapping = get_vocab_mapping(target_tok, draft_tok, target.vocab_size, draft.vocab_size,
                                    key=key).to(device)
        feedback = TargetToDraft(mapping, target_tok, draft_tok, spec.heterogeneous_vocab_feedback)
        inputs = TLIDraft(kv, mapping, feedback, probabilistic, method)
        draft_len = spec.draft_max_model_len
    else:
        inputs = SharedVocabDraft(kv, target.vocab_size, probabilistic, method)
        draft_len = min(spec.draft_max_model_len, target.max_model_len)
    return DraftProposer(forward, inputs, spec.num_speculative_tokens, target.max_model_len,
                         draft_len, config.scheduler_config.max_num_batched_tokens, device)


def build_samplers(spec: Optional[SpeculativeConfig], seed: int
                   ) -> tuple[RejectionSampler, Sampler]:
    """The verifier and the plain sampler for the engine's rejection_sample_method. The plain
    sampler couples the rows the verifier couples (every sampled row under "gumbel", seeded
    sampled rows under "auto", the default), so steps without drafts (adaptive k = 0, a
    batch-size schedule's 0, a request still catching up) emit the token a verification would
    have. An engine without a draft samples as the default method does: under "auto", adding a
    draft (or adaptive speculation's timing) never changes a seeded request's tokens."""
    method = spec.rejection_sample_method if spec is not None else DEFAULT_REJECTION_METHOD
    if method == "synthetic":  # benchmarks only
        return SyntheticRejectionSampler(spec.acceptance_rates(), seed), Sampler()
    if method == "gumbel":
        return GumbelRejectionSampler(), Sampler("gumbel")
    if method == "auto":
        return AutoRejectionSampler(), Sampler("auto")
    return RejectionSampler(), Sampler()
