"""The messages between `tandem serve`'s API process and its engine core process, and their
frames.

Requests in: `AddRequest`, `AbortRequests`, `UtilityCall`, `Shutdown`. Out: `Ready` (or
`StartupFailed`) once, then one `EngineCoreOutputs` per turn of the engine loop, carrying
everything that turn produced: the answers to admissions, every request's new output (as deltas,
`output_deltas.py`), a metrics snapshot when due, utility results, or why the engine died.
Batching a step's outputs into one message keeps the channel's cost per step, not per request.

Frames are a 4-byte little-endian length and a pickle of plain dataclasses (both ends are our own
processes on one machine, over a socketpair nobody else holds), except that the output deltas,
most of what crosses, travel as one msgspec MessagePack array inside it: at 16 streams a step's
frame is encoded in 2.4 us and decoded in 9, where a pickle of them took 30 and 40 (Intel Xeon
6/167, benchmarks/bench_channel_codec.py). A turn's message that holds nothing but deltas (most
of them) is that array alone, flagged by the length's top bit, with no pickle around it:
unpickling even a one-token frame took the API process about 35 us of CPU at one stream (its
caches cold after the engine's step), a tenth of what it spent a token.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import msgspec

from tandem.engine.output_deltas import OutputDelta
from tandem.sampling_params import SamplingParams

HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 31  # a frame's length must fit the 4-byte header's lower 31 bits
_DELTAS_ONLY = 1 << 31     # the header's top bit: the payload is a MessagePack array of deltas


# ---- requests in ------------------------------------------------------------------------------

@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: Union[str, list[int]]
    params: SamplingParams
    final_only: bool = False  # one output, when finished (a response that is not streamed)


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


# The engine methods a utility call may name (no arbitrary code crosses the channel).
UTILITY_METHODS = ("get_metrics", "num_free_kv_blocks")


@dataclass(frozen=True)
class UtilityCall:
    call_id: int
    method: str

    def __post_init__(self) -> None:
        if self.method not in UTILITY_METHODS:
            raise ValueError(f"UtilityCall.method must be one of {UTILITY_METHODS}, "
                             f"not {self.method!r}")


@dataclass(frozen=True)
class Shutdown:
    pass


ClientMessage = Union[AddRequest, AbortRequests, UtilityCall, Shutdown]


# ---- outputs out ------------------------------------------------------------------------------

@dataclass
class AddResult:
    request_id: str
    error_type: Optional[str] = None  # "ValueError" (the client's fault: a 400) or another name
    error: Optional[str] = None


@dataclass
class UtilityResult:
    call_id: int
    result: Any = None
    error: Optional[str] = None


@dataclass
class EngineCoreOutputs:
    added: list[AddResult] = field(default_factory=list)
    outputs: list[OutputDelta] = field(default_factory=list)
    metrics: Optional[list] = None     # the engine's metrics, when a snapshot is due
    utility: list[UtilityResult] = field(default_factory=list)
    dead: Optional[str] = None         # the engine cannot go on, and why

    def __bool__(self) -> bool:
        return bool(self.added or self.outputs or self.metrics is not None or self.utility
                    or self.dead)

    def __reduce__(self) -> tuple:
        # the deltas, a message's bulk, as one MessagePack array inside the pickle
        return (_outputs_from_wire, (self.added, _DELTAS_OUT.encode(self.outputs), self.metrics,
                                     self.utility, self.dead))


_DELTAS_OUT = msgspec.msgpack.Encoder()
_DELTAS_IN = msgspec.msgpack.Decoder(list[OutputDelta])


def _outputs_from_wire(added: list[AddResult], deltas: bytes, metrics: Optional[list],
                       utility: list[UtilityResult], dead: Optional[str]) -> EngineCoreOutputs:
    return EngineCoreOutputs(added, _DELTAS_IN.decode(deltas), metrics, utility, dead)


@dataclass(frozen=True)
class Ready:
    """The engine core loaded its models and serves (the first message it sends)."""
    num_blocks: int
    metrics: list


@dataclass(frozen=True)
class StartupFailed:
    """The engine core could not start; `message` is one line for the user."""
    message: str


# ---- frames -----------------------------------------------------------------------------------

def encode_frame(message: Any) -> bytes:
    flag = 0
    if type(message) is EngineCoreOutputs and not (message.added or message.utility
                                                   or message.metrics is not None or message.dead):
        payload, flag = _DELTAS_OUT.encode(message.outputs), _DELTAS_ONLY
    else:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) >= MAX_FRAME_BYTES:
        raise ValueError(f"a channel message of {len(payload)} bytes is over the frame limit")
    return HEADER.pack(len(payload) | flag) + payload


class FrameBuffer:
    """Bytes in, whole messages out (a read may end anywhere inside a frame)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        messages = []
        start = 0
        while len(self._buf) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf, start)
            end = start + HEADER.size + (size & ~_DELTAS_ONLY)
            if len(self._buf) < end:
                break
            with memoryview(self._buf)[start + HEADER.size:end] as payload:  # let go before
                if size & _DELTAS_ONLY:                                      # the buffer shrinks
                    messages.append(EngineCoreOutputs(outputs=_DELTAS_IN.decode(payload)))
                else:
                    messages.append(pickle.loads(payload))
            start = end
        if start:
            del self._buf[:start]
        return messages

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
