"""The engine channel's codec (issue 45): the deltas as pickled dataclasses, as `tandem serve`
framed them first, against the channel's frames now (the deltas as msgspec Structs, one
MessagePack array inside the pickle), on the frames one decode step sends.

For --streams requests each given one new token a step (and, with --logprobs, its 5 top
alternatives), the `EngineCoreOutputs` a step sends is built from real `DeltaEncoder` deltas;
then its encoding (engine core side) and its decoding (API side) are timed, median of --reps.

  python benchmarks/bench_channel_codec.py [--streams 1 16 64 256] [--logprobs]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

from tandem.engine.core_messages import EngineCoreOutputs, FrameBuffer, encode_frame  # noqa: E402
from tandem.engine.output_deltas import CompletionDelta, DeltaEncoder, OutputDelta  # noqa: E402
from tandem.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402


def _mirror(struct: type) -> type:
    """A plain dataclass with the Struct's fields: the deltas as they were when the channel was
    all pickle (module-level, so pickle finds it by name)."""
    cls = make_dataclass(f"_{struct.__name__}D", [f.name for f in msgspec.structs.fields(struct)])
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


_CompletionDeltaD = _mirror(CompletionDelta)
_OutputDeltaD = _mirror(OutputDelta)


@dataclass
class _EngineCoreOutputsD:
    added: list
    outputs: list


def _as_dataclasses(frame: EngineCoreOutputs) -> _EngineCoreOutputsD:
    return _EngineCoreOutputsD([], [_OutputDeltaD(*msgspec.structs.astuple(d)[:-1], [
        _CompletionDeltaD(*msgspec.structs.astuple(c)) for c in d.completions])
        for d in frame.outputs])


def _step_frame(streams: int, logprobs: bool) -> EngineCoreOutputs:
    """What one decode step sends: each request's 41st token, as a delta."""
    encoder = DeltaEncoder()
    deltas = []
    for r in range(streams):
        tokens = [100 + t for t in range(41)]
        lps = [{t: Logprob(-0.5, 1, " w"), **{a: Logprob(-3.0, 2 + a, " a") for a in range(4)}}
               for t in tokens] if logprobs else None
        def out(n: int) -> RequestOutput:
            return RequestOutput(f"cmpl-{r:08x}-0", None, list(range(30)), None, [
                CompletionOutput(0, " word" * n, tokens[:n], -0.5 * n if lps else None,
                                 lps[:n] if lps else None, token_origins=["target"] * n,
                                 rejected_draft_ids=[None] * n)], False)
        encoder.encode(out(40))
        deltas.append(encoder.encode(out(41)))
    return EngineCoreOutputs(outputs=deltas)


def _median_us(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(streams: int, logprobs: bool, reps: int) -> dict[str, float]:
    frame = _step_frame(streams, logprobs)
    row: dict[str, float] = {"streams": streams}
    old = _as_dataclasses(frame)
    pickled = pickle.dumps(old, protocol=pickle.HIGHEST_PROTOCOL)
    row["pickle_bytes"] = len(pickled)
    row["pickle_encode_us"] = _median_us(
        lambda: pickle.dumps(old, protocol=pickle.HIGHEST_PROTOCOL), reps)
    row["pickle_decode_us"] = _median_us(lambda: pickle.loads(pickled), reps)
    framed = encode_frame(frame)
    fb = FrameBuffer()
    assert fb.feed(framed) == [frame]  # the same message back
    row["channel_bytes"] = len(framed)
    row["channel_encode_us"] = _median_us(lambda: encode_frame(frame), reps)
    row["channel_decode_us"] = _median_us(lambda: fb.feed(framed), reps)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--logprobs", action="store_true", help="5 logprobs a token")
    p.add_argument("--reps", type=int, default=2000)
    args = p.parse_args()
    rows = []
    print("streams   bytes (pickle / channel)   encode us (pickle / channel)   "
          "decode us (pickle / channel)")
    for streams in args.streams:
        r = measure(streams, args.logprobs, max(50, args.reps // streams))
        rows.append(r)
        print(f"{streams:7d}   {r['pickle_bytes']:8.0f} / {r['channel_bytes']:7.0f}   "
              f"{r['pickle_encode_us']:14.1f} / {r['channel_encode_us']:7.1f}   "
              f"{r['pickle_decode_us']:14.1f} / {r['channel_decode_us']:7.1f}")
    print(save("channel-codec" + ("-logprobs" if args.logprobs else ""), {"rows": rows}))


if __name__ == "__main__":
    main()
