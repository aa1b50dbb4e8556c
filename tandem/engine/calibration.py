"""Load-time calibration of adaptive speculation: before the first request, the engine speculates
on a sample text with every k from K down to 0, so adaptive k starts from measured costs and
acceptance instead of priors.

Why. A fresh controller knew nothing: it drafted K tokens on its first step to time them, then
learned acceptance from Beta priors centred on 1/2. On a few short requests that learning was
most of the run, and it lost: 0.90-0.94x plain with a useless draft, and 0.76-0.82x the best
fixed k on a good pair (issue 28, AMD EPYC). Here every verify size 1..K+1 and the draft pass are
timed at load, and the sample text's acceptance is evidence like any other (it fades as real
requests add theirs; Thompson draws still try a position as long as it may pay).

How. One greedy request on `SAMPLE_TEXT` runs through the ordinary step loop with k forced per
step (`Drafting.forced`): one cycle K..0 to warm up (the first pass of each size also picks its
matmul kernels, which a first user request would otherwise pay for), then `_CYCLES` cycles timed
into a fresh controller, which keeps the warm-up's acceptance too (more evidence: a useless
draft's first position then has 9 misses for K = 3, and a Thompson draw seldom tries it again).
Then the request is aborted and every counter /metrics reports is zeroed. The request is greedy
and seeded, so it draws nothing from the engine's random stream: what the engine does after
calibration is what it did before, but for the choice of k.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional, Protocol, Union

from tandem.engine.drafting import Drafting
from tandem.sampling_params import SamplingParams
from tandem.spec_decode.adaptive import AdaptiveK

logger = logging.getLogger("tandem")

# Plain English prose (any text works; this one is neither code nor a list, so a draft of a
# general model agrees with its target about as often as on ordinary requests).
SAMPLE_TEXT = ("The old lighthouse keeper climbed the narrow stairs every evening, carrying a "
               "lamp and a small notebook in which he wrote down the ships he saw")
_CYCLES = 2           # timed cycles of k = K..0 after the warm-up cycle
_REQUEST_ID = "tandem-calibration"


class Engine(Protocol):
    """What calibration uses of an LLMEngine (which calls it, so it is named by its shape)."""
    drafting: Optional[Drafting]
    proposer: Any
    tokenizer: Any
    model_config: Any

    def add_request(self, request_id: str, prompt: Union[str, list[int]],
                    params: Optional[SamplingParams] = None) -> None: ...
    def has_unfinished_requests(self) -> bool: ...
    def step(self) -> list[Any]: ...
    def abort_request(self, request_id: str) -> None: ...
    def reset_stats(self) -> None: ...


def calibrate(engine: Engine) -> None:
    drafting = engine.drafting
    assert drafting is not None and drafting.adaptive is not None
    k_max = drafting.k_max
    cycle = list(range(k_max, -1, -1))                 # K..0: every verify size, and plain
    per_cycle = sum(k + 1 for k in cycle)              # the most tokens one cycle emits
    max_len = engine.model_config.max_model_len
    ids = engine.tokenizer.encode(SAMPLE_TEXT)[:max(1, max_len // 2)]  # a short context fits
    room = max_len - len(ids)
    params = SamplingParams(temperature=0.0, seed=0, ignore_eos=True,
                            max_tokens=max(1, min(room, (_CYCLES + 1) * per_cycle + 1)))
    t0 = time.perf_counter()
    # A model-free proposer finds little in a sample text: padded to k, its drafts time every
    # verify size, but say nothing of its acceptance, which then starts from the priors.
    padded = hasattr(engine.proposer, "fill")
    if padded:
        engine.proposer.fill = True
    if hasattr(engine.proposer, "learn"):  # the sample text's output is no request's to learn
        engine.proposer.learn = False
    drafting.adaptive = AdaptiveK(k_max)               # the warm-up's timings are discarded
    drafting.forced.extend(cycle)
    engine.add_request(_REQUEST_ID, ids, params)
    timed = False
    while engine.has_unfinished_requests():
        if not drafting.forced:
            if timed:
                break
            timed = True
            warmed, drafting.adaptive = drafting.adaptive, AdaptiveK(k_max)  # timed from here
            drafting.adaptive.hits, drafting.adaptive.misses = warmed.hits, warmed.misses
            drafting.forced.extend(cycle * _CYCLES)
        engine.step()
    engine.abort_request(_REQUEST_ID)                  # frees its blocks
    if hasattr(engine.proposer, "learn"):
        engine.proposer.learn = True
    drafting.forced.clear()
    controller = drafting.adaptive
    if padded:
        engine.proposer.fill = False
        controller.hits, controller.misses = [0.0] * k_max, [0.0] * k_max
        controller.streak_hits, controller.streak_misses = [0.0] * k_max, [0.0] * k_max
        # Padding covered every position: a lookup's coverage starts from its prior too.
        controller.covered, controller.offered = [0.0] * k_max, [0.0] * k_max
        controller.streak_covered, controller.streak_offered = [0.0] * k_max, [0.0] * k_max
    drafting.calibration = controller
    drafting.adaptive = drafting.fresh_controller(drafting.k)
    engine.reset_stats()
    sizes = sorted(controller.target.sizes)
    logger.info(
        "Calibrated adaptive speculation in %.1f s: a target pass over %s tokens takes %s ms, a "
        "draft pass %s ms; acceptance on a sample text by position %s",
        time.perf_counter() - t0, "/".join(map(str, sizes)),
        "/".join(f"{1e3 * controller.target(s):.1f}" for s in sizes),
        f"{1e3 * controller.draft(1):.1f}" if controller.draft.ready else "?",
        "/".join(f"{r:.2f}" for r in controller.rates))
