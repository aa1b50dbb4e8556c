"""Sample logprobs held as flat rows (tandem/logprob_rows.py): the same dicts as before, read
back from a few bytes an entry on both sides of the engine channel (issue 45: a stalled reader
of a 4,096-token stream with 20 logprobs a token held 17 MB a side as dicts)."""

from __future__ import annotations

import pickle
import tracemalloc

import pytest
import torch

from tandem.engine.core_messages import EngineCoreOutputs, FrameBuffer, encode_frame
from tandem.engine.output_deltas import DeltaEncoder, OutputAssembler
from tandem.logprob_rows import LogprobRows, TokenTexts
from tandem.outputs import CompletionOutput, Logprob, RequestOutput
from tandem.sample.logprobs import compute_logprobs


def _text(token: int) -> str:
    return f"<{token}>"


def _dicts_as_before(lp, text) -> list[dict[int, Logprob]]:
    """The runner's former dict building: the sampled token with its rank, then the top-k with
    ranks 1..k, the sampled token keeping its own entry."""
    ids, vals, ranks = lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist()
    rows = []
    for row_ids, row_vals, rank in zip(ids, vals, ranks):
        entry = {row_ids[0]: Logprob(row_vals[0], rank, text(row_ids[0]))}
        for r, (tid, val) in enumerate(zip(row_ids[1:], row_vals[1:]), start=1):
            entry.setdefault(tid, Logprob(val, r, text(tid)))
        rows.append(entry)
    return rows


@pytest.mark.parametrize("k", [0, 1, 5, -1])
def test_rows_read_back_the_dicts_the_runner_built_before(k: int) -> None:
    g = torch.Generator().manual_seed(k + 3)
    logits = torch.randn(6, 40, generator=g) * 3
    chosen = torch.tensor([int(logits[0].argmax()), 3, 17, int(logits[3].argmax()), 0, 39])
    lp = compute_logprobs(logits, chosen, k)  # greedy rows: the sampled token is also top-1
    rows = LogprobRows(_text)
    for j in range(6):
        rows.append_row(lp.chunk(), j)
    want = _dicts_as_before(lp, _text)
    assert rows == want and list(rows) == want and rows[2:5] == want[2:5] and rows[-1] == want[-1]
    assert [list(r) for r in rows] == [list(w) for w in want]  # the same order, too
    assert pickle.loads(pickle.dumps(rows)) == want  # as a plain list: no tokenizer travels
    back = LogprobRows(_text)
    back.append_bytes(*rows.tail_bytes(0))
    assert back == want


def test_a_view_keeps_what_it_saw_and_the_assembler_restarts_an_earlier_delta() -> None:
    rows = LogprobRows()
    rows.append_dicts([{1: Logprob(-0.5, 1)}, {2: Logprob(-0.25, 2), 3: Logprob(-1.5, 1)}])
    view = rows.view()
    rows.append_dicts([{4: Logprob(-2.0, 3)}])
    assert len(view) == 2 and len(rows) == 3 and view[-1] == {2: Logprob(-0.25, 2),
                                                             3: Logprob(-1.5, 1)}
    with pytest.raises(TypeError):
        view.append_dicts([{5: Logprob(-1.0, 1)}])
    with pytest.raises(IndexError):
        view[2]
    cut = rows.prefix(1)
    cut.append_dicts([{9: Logprob(-3.0, None)}])
    assert cut == [{1: Logprob(-0.5, 1)}, {9: Logprob(-3.0, None)}] and len(rows) == 3


def test_token_texts_decode_each_token_once() -> None:
    calls: list[list[int]] = []

    class Tok:
        def decode(self, ids: list[int]) -> str:
            calls.append(ids)
            return f"w{ids[0]}"

    texts = TokenTexts(Tok())
    assert [texts(7), texts(8), texts(7)] == ["w7", "w8", "w7"] and calls == [[7], [8]]


def _held_bytes(build) -> int:
    tracemalloc.start()
    held = build()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert held is not None
    return size


def test_a_long_stream_with_20_logprobs_holds_a_few_bytes_an_entry_on_each_side() -> None:
    """4,096 tokens with 20 logprobs each (21 entries a token): the engine's request rows and the
    API's assembled rows (after every step's delta crossed the channel) each hold at most
    24 bytes an entry, where dicts of Logprob objects held about 200."""
    tokens, width = 4096, 21
    g = torch.Generator().manual_seed(0)
    lp = compute_logprobs(torch.randn(tokens, 300, generator=g), torch.arange(tokens) % 300,
                          width - 1)
    chunk = lp.chunk()
    budget = 24 * tokens * width

    def engine_side() -> LogprobRows:
        rows = LogprobRows(_text)
        for j in range(tokens):
            rows.append_row(chunk, j)
        return rows

    assert _held_bytes(engine_side) < budget
    rows = engine_side()
    encoder = DeltaEncoder()
    deltas = []
    for n in range(64, tokens + 1, 64):  # a step every 64 tokens
        view = rows.prefix(n)
        out = RequestOutput("r", None, [1], None, [CompletionOutput(
            0, "", list(range(n)), None, view, "length" if n == tokens else None)],
            finished=n == tokens)
        frame = encode_frame(EngineCoreOutputs(outputs=[encoder.encode(out)]))
        (msg,) = FrameBuffer().feed(frame)
        deltas.append(msg.outputs[0])

    def api_side() -> object:
        assembler = OutputAssembler(_text)
        assembler.add("r", [1])
        return [assembler.apply_lazily(d) for d in deltas][-1]  # the final output, not yet built

    assert _held_bytes(api_side) < budget + 64 * len(deltas) * 20  # + the deltas' small parts
    final = api_side()()
    assert final.outputs[0].logprobs == _dicts_as_before(lp, _text)
