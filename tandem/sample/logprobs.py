"""Logprobs of the sampled token plus the top-k alternatives, from the RAW logits (vLLM's default
`raw_logprobs`: before penalties, temperature and filtering)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.logprob_rows import LogprobChunk


@dataclass
class LogprobsTensors:
    token_ids: torch.Tensor  # [N, k+1] int64: column 0 = the chosen token, then the top-k ids
    logprobs: torch.Tensor   # [N, k+1] float32 log_softmax of the raw logits at those ids
    ranks: torch.Tensor      # [N] int64 rank of the chosen token (1 = most likely)

    def chunk(self) -> LogprobChunk:
        """As the engine holds them (logprob_rows.py): row j's k+1 ids and values, its rank."""
        return LogprobChunk(self.token_ids.shape[1], self.token_ids.flatten().tolist(),
                            self.logprobs.flatten().tolist(), self.ranks.tolist())


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                     num_logprobs: int) -> LogprobsTensors:
    """logits: [N, V] raw; token_ids: [N] the chosen tokens; num_logprobs: top-k alternatives to
    return (0 = only the chosen token, -1 = the whole vocabulary, as vLLM)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    vocab_size = logprobs.shape[-1]
    k = vocab_size if num_logprobs == -1 else min(num_logprobs, vocab_size)
    if k < 0:
        raise ValueError(f"num_logprobs must be -1 or at least 0, got {num_logprobs}.")
    chosen = token_ids.to(device=logprobs.device, dtype=torch.int64).unsqueeze(1)  # [N, 1]
    chosen_lp = logprobs.gather(-1, chosen)                                         # [N, 1]
    top_lp, top_ids = logprobs.topk(k, dim=-1)                                      # [N, k]
    # vLLM counts every token at least as likely as the chosen one (ties rank pessimistically).
    ranks = (logprobs >= chosen_lp).sum(dim=-1)                                     # [N]
    return LogprobsTensors(
        token_ids=torch.cat([chosen, top_ids], dim=1),
        logprobs=torch.cat([chosen_lp, top_lp], dim=1),
        ranks=ranks.to(torch.int64),
    )
