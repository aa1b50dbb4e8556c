"""SamplingMetadata: the per-row sampling options of one batch, as tensors, plus per-row randomness.

One row per request (or, after `expand`, one row per verified position). Row i's random numbers come
from `rngs[i]` keyed by the output position `positions[i]` it decides (see random.py), so a
request's output never depends on what else is in the batch, nor on how its steps were scheduled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import torch

from tandem.sample.random import Purpose, SeededRandom

if TYPE_CHECKING:
    from tandem.sampling_params import SamplingParams


_TOP_K_CAP = 2**31  # larger than any vocabulary


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor         # [B] float32, 0.0 for greedy rows
    top_p: torch.Tensor               # [B] float32, 1.0 = off
    top_k: torch.Tensor               # [B] int64, 0 = off
    min_p: torch.Tensor               # [B] float32, 0.0 = off
    presence_penalty: torch.Tensor    # [B] float32, 0.0 = off
    frequency_penalty: torch.Tensor   # [B] float32, 0.0 = off
    repetition_penalty: torch.Tensor  # [B] float32, 1.0 = off
    rngs: list[SeededRandom]           # [B], one per row; copies made by `expand` share the object
    positions: list[int]               # [B] output position (index of the token) each row decides
    seeded: list[bool]                 # [B] the request has its own seed (SamplingParams.seed):
                                       # rejection method "auto" samples such rows by Gumbel-max
    output_token_ids: list[list[int]]  # [B] tokens generated so far (frequency/presence/repetition)
    prompt_token_ids: list[list[int]]  # [B] prompt tokens (repetition penalty only, as vLLM)
    all_greedy: bool
    all_random: bool
    no_penalties: bool
    no_filters: bool  # no random row uses top-p, top-k or min-p

    @property
    def num_rows(self) -> int:
        return len(self.rngs)

    def uniforms(self, purpose: Purpose, offsets: list[int] | None = None) -> torch.Tensor:
        """[B] float64: row i's uniform for `purpose` at position positions[i] + offsets[i]."""
        offsets = offsets or [0] * self.num_rows
        return torch.tensor([r.uniform(p + o, purpose) for r, p, o in
                             zip(self.rngs, self.positions, offsets)], dtype=torch.float64,
                            device=self.temperature.device)

    @classmethod
    def from_params(cls, params: list[SamplingParams], output_token_ids: list[list[int]],
                    prompt_token_ids: list[list[int]], rngs: list[SeededRandom],
                    device: torch.device, positions: list[int] | None = None
                    ) -> SamplingMetadata:
        """`positions` defaults to len(output_token_ids[i]): the next token's index."""
        n = len(params)
        if not (len(output_token_ids) == len(prompt_token_ids) == len(rngs) == n):
            raise ValueError(
                f"SamplingMetadata needs one entry per request: {n} params, "
                f"{len(output_token_ids)} output_token_ids, {len(prompt_token_ids)} "
                f"prompt_token_ids, {len(rngs)} rngs.")
        if positions is None:
            positions = [len(t) for t in output_token_ids]

        def f32(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        greedy = [p.temperature == 0.0 for p in params]
        random_params = [p for p, g in zip(params, greedy) if not g]
        return cls(
            temperature=f32([p.temperature for p in params]),
            top_p=f32([p.top_p for p in params]),
            # SamplingParams maps -1 to 0 already; clamp so "off" is 0 and any k fits in int64
            # (a k past the vocabulary keeps every token, as "off" does).
            top_k=torch.tensor([min(max(p.top_k, 0), _TOP_K_CAP) for p in params],
                               dtype=torch.int64, device=device),
            min_p=f32([p.min_p for p in params]),
            presence_penalty=f32([p.presence_penalty for p in params]),
            frequency_penalty=f32([p.frequency_penalty for p in params]),
            repetition_penalty=f32([p.repetition_penalty for p in params]),
            rngs=list(rngs), positions=list(positions),
            seeded=[p.seed is not None for p in params],
            output_token_ids=[list(t) for t in output_token_ids],
            prompt_token_ids=[list(t) for t in prompt_token_ids],
            all_greedy=all(greedy),
            all_random=not any(greedy),
            no_penalties=not any(p.has_penalties for p in params),
            # Filters only matter for random rows: greedy rows become a one-hot anyway.
            no_filters=all(p.top_p >= 1.0 and p.top_k <= 0 and p.min_p <= 0.0
                           for p in random_params),
        )

    def expand(self, counts: list[int],
               extra_output_ids: list[list[list[int]]]) -> SamplingMetadata:
        """Row i repeated counts[i] times; copy j of row i sees output_token_ids[i] +
        extra_output_ids[i][j] (the rejection sampler passes the draft prefix drafts[:j])."""
        if len(counts) != self.num_rows or len(extra_output_ids) != self.num_rows:
            raise ValueError(f"expand needs one count and one extra list per row "
                             f"({self.num_rows}), got {len(counts)} and {len(extra_output_ids)}.")
        for i, (c, extra) in enumerate(zip(counts, extra_output_ids)):
            if len(extra) != c:
                raise ValueError(f"row {i}: counts says {c} copies but extra_output_ids has "
                                 f"{len(extra)}.")
        device = self.temperature.device
        repeats = torch.tensor(counts, dtype=torch.int64, device=device)  # [B]

        def rep(t: torch.Tensor) -> torch.Tensor:  # [B] -> [sum(counts)]
            return torch.repeat_interleave(t, repeats, output_size=sum(counts))

        rngs: list[SeededRandom] = []
        positions: list[int] = []
        seeded: list[bool] = []
        outputs: list[list[int]] = []
        prompts: list[list[int]] = []
        for i, c in enumerate(counts):
            rngs += [self.rngs[i]] * c
            seeded += [self.seeded[i]] * c
            positions += [self.positions[i] + j for j in range(c)]
            prompts += [self.prompt_token_ids[i]] * c  # shared, never mutated
            outputs += [self.output_token_ids[i] + list(e) for e in extra_output_ids[i]]
        return SamplingMetadata(
            temperature=rep(self.temperature), top_p=rep(self.top_p), top_k=rep(self.top_k),
            min_p=rep(self.min_p), presence_penalty=rep(self.presence_penalty),
            frequency_penalty=rep(self.frequency_penalty),
            repetition_penalty=rep(self.repetition_penalty),
            rngs=rngs, positions=positions, seeded=seeded, output_token_ids=outputs,
            prompt_token_ids=prompts,
            all_greedy=self.all_greedy, all_random=self.all_random,
            no_penalties=self.no_penalties, no_filters=self.no_filters,
        )

    def shifted(self, offset: Union[int, list[int]]) -> SamplingMetadata:
        """The same rows deciding the positions `offset` tokens later (the draft's later steps),
        or offset[i] tokens later for row i (drafts read from a lookahead's rows)."""
        offsets = [offset] * self.num_rows if isinstance(offset, int) else offset
        return dataclasses.replace(self, positions=[p + o for p, o in zip(self.positions,
                                                                          offsets)])

    def select(self, rows: list[int]) -> SamplingMetadata:
        """The sub-batch of the given rows, in that order (rngs are shared, not copied)."""
        if rows == list(range(self.num_rows)):
            return self
        index = torch.tensor(rows, dtype=torch.int64, device=self.temperature.device)  # [R]
        greedy = [float(t) == 0.0 for t in self.temperature[index].tolist()]
        return SamplingMetadata(
            temperature=self.temperature[index], top_p=self.top_p[index], top_k=self.top_k[index],
            min_p=self.min_p[index], presence_penalty=self.presence_penalty[index],
            frequency_penalty=self.frequency_penalty[index],
            repetition_penalty=self.repetition_penalty[index],
            rngs=[self.rngs[i] for i in rows], positions=[self.positions[i] for i in rows],
            seeded=[self.seeded[i] for i in rows],
            output_token_ids=[self.output_token_ids[i] for i in rows],
            prompt_token_ids=[self.prompt_token_ids[i] for i in rows],
            all_greedy=all(greedy), all_random=not any(greedy),
            # Still valid for a subset (they are "for all rows" statements).
            no_penalties=self.no_penalties, no_filters=self.no_filters,
        )
