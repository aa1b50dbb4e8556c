"""From raw logits to the distribution a row is sampled from: penalties, temperature, min-p, top-k,
top-p (vLLM semantics). Everything runs in float32 and never modifies its input in place."""

from __future__ import annotations

import torch

from tandem.kernels import cpu_sampling
from tandem.sample.metadata import SamplingMetadata


def _token_counts(token_lists: list[list[int]], vocab_size: int,
                  device: torch.device) -> torch.Tensor:
    """[B, V] float32 occurrence counts; ids outside [0, V) are ignored."""
    counts = torch.zeros(len(token_lists), vocab_size, dtype=torch.float32, device=device)
    rows = [i for i, tokens in enumerate(token_lists) for _ in tokens]
    cols = [t for tokens in token_lists for t in tokens]
    if not cols:
        return counts
    row_t = torch.tensor(rows, dtype=torch.int64)  # [T]
    col_t = torch.tensor(cols, dtype=torch.int64)  # [T]
    valid = (col_t >= 0) & (col_t < vocab_size)
    row_t, col_t = row_t[valid].to(device), col_t[valid].to(device)
    counts.index_put_((row_t, col_t), torch.ones_like(row_t, dtype=torch.float32),
                      accumulate=True)
    return counts


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """vLLM penalties on [B, V] logits, returned as a new float32 tensor.

    repetition: tokens seen in prompt or output get positive logits divided, non-positive ones
    multiplied by the penalty; frequency: subtract penalty * count over the output; presence:
    subtract penalty * [count > 0] over the output.
    """
    logits = logits.float().clone()  # [B, V]
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return logits
    device = logits.device
    output_counts = _token_counts(md.output_token_ids, vocab_size, device)  # [B, V]
    output_seen = output_counts > 0                                         # [B, V]
    prompt_seen = _token_counts(md.prompt_token_ids, vocab_size, device) > 0  # [B, V]

    rep = md.repetition_penalty.to(device).unsqueeze(1)  # [B, 1]
    seen = prompt_seen | output_seen
    rep_scale = torch.where(seen, rep, torch.ones_like(rep))  # [B, V]
    logits = torch.where(logits > 0, logits / rep_scale, logits * rep_scale)
    logits -= md.frequency_penalty.to(device).unsqueeze(1) * output_counts
    logits -= md.presence_penalty.to(device).unsqueeze(1) * output_seen.float()
    return logits


# Top-k/top-p look only at this many most likely tokens when the kept prefix provably ends there;
# a full sort of a 50k-262k vocabulary per row costs more than the model's decode step on a CPU.
_CANDIDATES = 1024


def filter_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor) -> torch.Tensor:
    """min-p, then top-k, then top-p on [B, V] probabilities; returns the renormalised result.

    One stable descending sort serves all three, so ties are broken towards the lower token id.
    Each filter keeps a prefix of the sorted order, so their combination is a prefix too. Large
    vocabularies sort only the top `_CANDIDATES` tokens; rows whose top-k reaches past them, and
    rows whose kept prefix could reach past them (or end in a tie with the first excluded token),
    take the full sort. Which sort a row takes, and every sum, depends on that row alone, so a
    row's distribution has the same bits whatever else is in its batch.
    """
    vocab_size = probs.shape[-1]
    c = min(vocab_size, _CANDIDATES)
    if c == vocab_size:
        keep, sorted_p, order = _filter_sorted(probs, top_k, top_p, min_p, c)
        filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)  # [B, V]
        return _renormalised(probs, filtered, top_k, top_p, min_p)
    filtered = torch.zeros_like(probs)                                         # [B, V]
    wide = top_k > c                                                           # [B]
    narrow = (~wide).nonzero().flatten()                                       # [N]
    full = wide.nonzero().flatten()                                            # [F]
    if len(narrow):
        sub = len(narrow) < probs.shape[0]
        p_n = probs[narrow] if sub else probs
        keep, sorted_p, order = _filter_sorted(p_n, top_k[narrow], top_p[narrow],
                                               min_p[narrow], c)
        f_n = torch.zeros_like(p_n).scatter_(-1, order, sorted_p * keep)
        if sub:
            filtered[narrow] = f_n
        else:
            filtered = f_n
        kept_min = torch.where(keep, sorted_p, torch.full_like(sorted_p, 2.0)).amin(dim=-1)
        again = keep[:, -1] | (sorted_p[:, -1] >= kept_min)                    # [N]
        full = torch.cat((full, narrow[again]))
    if len(full):
        keep_r, sorted_r, order_r = _filter_sorted(probs[full], top_k[full], top_p[full],
                                                   min_p[full], vocab_size)
        filtered[full] = torch.zeros_like(probs[full]).scatter_(-1, order_r, sorted_r * keep_r)
    return _renormalised(probs, filtered, top_k, top_p, min_p)


def _renormalised(probs: torch.Tensor, filtered: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """filtered [B, V] renormalised; a row with no filter of its own keeps `probs` as they are,
    as it would in a batch where no row has one (its bits never depend on its neighbours')."""
    unfiltered = ((top_k <= 0) | (top_k >= probs.shape[-1])) & (top_p >= 1.0) & (min_p <= 0.0)
    return torch.where(unfiltered.unsqueeze(1), probs, filtered / row_sum(filtered))


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B, 1]: each row summed in one order whatever the batch (the CPU kernel's;
    torch's sum elsewhere, which on a CPU would split a lone row over the threads)."""
    fast = cpu_sampling.row_sum(x)
    return fast if fast is not None else x.sum(dim=-1, keepdim=True)


def _filter_sorted(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor, c: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep mask over the `c` most likely tokens in stable descending order: ([B, c] bool,
    [B, c] sorted probabilities, [B, c] their token ids)."""
    vocab_size = probs.shape[-1]
    if c == vocab_size:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [B, V] each
    else:
        cand_p, cand_ids = probs.topk(c, dim=-1)                            # [B, c]
        # topk does not promise an order among equal values: re-sort by id, then stably by p.
        ids, perm = cand_ids.sort(dim=-1)
        sorted_p, o2 = cand_p.gather(-1, perm).sort(dim=-1, descending=True, stable=True)
        order = ids.gather(-1, o2)
    position = torch.arange(c, device=probs.device).unsqueeze(0)  # [1, c]

    # min-p: drop tokens less likely than min_p times the most likely one.
    threshold = min_p.unsqueeze(1) * sorted_p[:, :1]                        # [B, 1]
    keep = sorted_p >= threshold                                            # [B, c]
    # top-k: keep the first k of the sorted order (0 = off).
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab_size))
    keep &= position < k.unsqueeze(1)
    # top-p on the distribution left after min-p/top-k: keep a token while the mass strictly
    # before it is still below top_p, i.e. the smallest prefix reaching top_p. Position 0 always
    # survives (its prefix mass is 0 < top_p); top_p >= 1 is "off", immune to rounding in cumsum.
    kept = sorted_p * keep                                  # [B, c]
    cum = kept.cumsum(dim=-1)                               # [B, c]
    if c == vocab_size:
        total = cum[:, -1:]
    else:
        # Mass after min-p and top-k over the whole vocabulary: with top-k <= c it all lies in
        # the candidates; without top-k it is every token above the min-p threshold.
        above = row_sum(probs * (probs >= threshold))          # [B, 1]
        total = torch.where(top_k.unsqueeze(1) > 0, cum[:, -1:], above)
    mass_before = (cum - kept) / total                      # [B, c]
    tp = top_p.unsqueeze(1)                                 # [B, 1]
    keep &= (mass_before < tp) | (tp >= 1.0)
    return keep, sorted_p, order


def compute_probs(logits: torch.Tensor, md: SamplingMetadata,
                  apply_penalty: bool = True) -> torch.Tensor:
    """[B, V] float32 distribution each row samples from.

    Random rows: penalties -> / temperature -> softmax -> min-p -> top-k -> top-p -> renormalise.
    Greedy rows (temperature 0): one-hot at the argmax of the penalised logits.
    Pass apply_penalty=False when `logits` are already penalised.
    """
    logits = logits.float()  # [B, V]
    if apply_penalty and not md.no_penalties:
        logits = apply_penalties(logits, md)
    device = logits.device
    temperature = md.temperature.to(device)  # [B]
    greedy = temperature == 0.0              # [B]

    def one_hot_argmax() -> torch.Tensor:  # [B, V]
        out = torch.zeros_like(logits)
        return out.scatter_(-1, greedy_tokens(logits).unsqueeze(-1), 1.0)

    if md.all_greedy:
        return one_hot_argmax()
    # Greedy rows divide by 1 here and are overwritten below.
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits / safe_t.unsqueeze(1), dim=-1)  # [B, V]
    if not md.no_filters:
        probs = filter_probs(probs, md.top_k.to(device), md.top_p.to(device),
                             md.min_p.to(device))
    if not md.all_random:
        probs = torch.where(greedy.unsqueeze(1), one_hot_argmax(), probs)
    return probs


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B] int64: each row's argmax, the first of equal maxima and a row's first NaN
    (torch.argmax's choice), by the CPU kernel where it reads the layout (16 rows of 49,152 on 2
    threads held to AVX2: torch's 333 us, the kernel's 49; one row 43 and 9)."""
    fast = cpu_sampling.argmax(logits)
    return fast if fast is not None else logits.argmax(dim=-1)
