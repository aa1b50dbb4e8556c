"""Counter-based randomness: every random number a request uses is a function of (its seed, the
output position it decides, what it is for), not of how many numbers were drawn before.

A stream generator (torch.Generator) hands out numbers in order, so anything that changes how many
are drawn - a step without drafts after a preemption, drafts cut by the token budget, a step
retried after a fault - shifts every later draw and changes a seeded request's text. Keyed draws
cannot shift: position p's draft, acceptance test and emitted token always see the same uniforms.
They stay independent of each other (distinct purposes) and of every earlier position, which is
all exact (rejection) sampling needs.
"""

from __future__ import annotations

import enum

_MASK = (1 << 64) - 1
_DOUBLE = 1.0 / (1 << 53)


class Purpose(enum.IntEnum):
    SAMPLE = 1   # the token emitted at a position: from p, or from the residual after a rejection
    ACCEPT = 2   # the acceptance test of the draft at a position
    DRAFT = 3    # the draft's own sample at a position (probabilistic drafting)
    GUMBEL = 4   # the Gumbel noise over the vocabulary at a position (sample/gumbel.py), shared
                 # by the draft's proposal and the target's token there


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers with full avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class SeededRandom:
    """Uniforms in [0, 1) keyed by (seed, position, purpose)."""

    __slots__ = ("seed", "_key")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._key = _mix(seed & _MASK)

    def uniform(self, position: int, purpose: Purpose) -> float:
        x = _mix(_mix(self._key ^ (position & _MASK)) ^ int(purpose))
        return (x >> 11) * _DOUBLE

    def noise_key(self, position: int) -> int:
        """64-bit key of the Gumbel noise vector at `position` (gumbel.py hashes tokens with it)."""
        return _mix(_mix(self._key ^ (position & _MASK)) ^ int(Purpose.GUMBEL))

    def __repr__(self) -> str:
        return f"SeededRandom(seed={self.seed})"
