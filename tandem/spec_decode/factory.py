"""Builds the draft proposer for a speculative config: same-vocabulary or TLI inputs."""

from __future__ import annotations

from typing import Callable

import torch

from tandem.config import EngineConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.loader.tokenizer import load_tokenizer
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
    # greedy request); under "gumbel" with the noise the target's token reads.
    probabilistic = spec.draft_sample_method in ("auto", "probabilistic")
    gumbel = spec.rejection_sample_method == "gumbel"
    if spec.uses_vocab_mapping:
        target_tok, draft_tok = load_tokenizer(target), load_tokenizer(draft)
        key = (target.tokenizer, target.revision, draft.tokenizer, draft.revision)
        mapping = get_vocab_mapping(target_tok, draft_tok, target.vocab_size, draft.vocab_size,
                                    key=key).to(device)
        feedback = TargetToDraft(mapping, target_tok, draft_tok, spec.heterogeneous_vocab_feedback)
        inputs = TLIDraft(kv, mapping, feedback, probabilistic, gumbel)
        draft_len = spec.draft_max_model_len
    else:
        inputs = SharedVocabDraft(kv, target.vocab_size, probabilistic, gumbel)
        draft_len = min(spec.draft_max_model_len, target.max_model_len)
    return DraftProposer(forward, inputs, spec.num_speculative_tokens, target.max_model_len,
                         draft_len, config.scheduler_config.max_num_batched_tokens, device)
