"""A request's sample logprobs as flat columns, not one dict of `Logprob` objects per token.

A position's logprobs are the chosen token and the top-k alternatives (`sample/logprobs.py`).
Held as `dict[int, Logprob]`, each entry is a dict slot, a `Logprob`, a float, an int and a
string: about 170 bytes (tracemalloc), 3.5 KB a token at 20 logprobs, 14 MB for a 4,096-token
stream, on each side of the engine channel. `LogprobRows` keeps every entry of every position
in flat arrays (token id int32, logprob float64, rank int32) and where each position's entries
end: 16 bytes an entry. A position's dict is built when it is read, with the same entries, order
and values as before; its texts come from a shared `TokenTexts` cache (each side of the channel
decodes with its own copy of the same tokenizer, so texts never travel). vLLM's `FlatLogprobs`
is the same idea.

The rows only grow (the `append_*` methods); `view()` is an O(1) snapshot of the rows held so
far, and a list-like read (`rows[i]`, `rows[a:b]`, iteration, `len`, `==`) behaves as the list
of dicts would. Pickling gives that list of dicts (no tokenizer travels).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Union, overload

from tandem.outputs import Logprob

assert array("i").itemsize == 4


class TokenTexts:
    """token id -> its text alone (`tokenizer.decode([id])`), each decoded once (the memo is
    bounded by the vocabulary: only tokens that appear in some logprobs enter it)."""

    __slots__ = ("_tokenizer", "_memo")

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._memo: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._memo.get(token_id)
        if text is None:
            text = self._memo[token_id] = self._tokenizer.decode([token_id])
        return text


class LogprobChunk(NamedTuple):
    """One step's logprobs of one request, as the runner gives them: row j (the step's j-th
    sampled token) is the token itself, then the top `width - 1` in order of rank."""
    width: int
    ids: list[int]       # [rows * width]
    values: list[float]  # [rows * width]
    ranks: list[int]     # [rows] the sampled token's rank

    def chosen_logprob(self, j: int) -> float:
        return self.values[j * self.width]


class LogprobRows(Sequence[dict[int, Logprob]]):
    __slots__ = ("ids", "values", "ranks", "ends", "texts", "_n")

    def __init__(self, texts: Optional[Callable[[int], str]] = None) -> None:
        # every entry of every row, row after row; a row's dict keeps the first entry of a token
        self.ids = array("i")     # token ids
        self.values = array("d")  # their logprobs (as given: exact)
        self.ranks = array("i")   # their ranks (1 = most likely; 0 = none)
        self.ends = array("q")    # [rows] where each row's entries end
        self.texts = texts        # decoded_token of each entry; None leaves it None
        self._n: Optional[int] = None  # a view's row count; None: the owner (all rows)

    # -- the owner's side ------------------------------------------------------------------

    def _writable(self) -> None:
        if self._n is not None:
            raise TypeError("a LogprobRows view is read-only")

    def append_row(self, chunk: LogprobChunk, j: int) -> None:
        """Row j of a runner's chunk: the sampled token with its rank, then ranks 1..k."""
        self._writable()
        w = chunk.width
        self.ids.extend(chunk.ids[j * w:(j + 1) * w])
        self.values.extend(chunk.values[j * w:(j + 1) * w])
        self.ranks.append(chunk.ranks[j])
        self.ranks.extend(range(1, w))
        self.ends.append(len(self.ids))

    def append_dicts(self, rows: Iterable[dict[int, Logprob]]) -> None:
        """Rows given as dicts (an engine that builds them), their texts left to `texts`."""
        self._writable()
        for row in rows:
            for tid, lp in row.items():
                self.ids.append(tid)
                self.values.append(lp.logprob)
                self.ranks.append(lp.rank or 0)
            self.ends.append(len(self.ids))

    def tail_bytes(self, start: int) -> tuple[bytes, bytes, bytes, bytes]:
        """Rows `start:` as (entries a row, ids, values, ranks), native byte order (both ends
        of the engine channel are this machine): what `append_bytes` takes."""
        n = len(self)
        lo = self.ends[start - 1] if start else 0
        hi = self.ends[n - 1] if n else 0
        bounds = self.ends[start:n]
        counts = array("i", (e - b for b, e in zip(itertools.chain((lo,), bounds), bounds)))
        return (counts.tobytes(), self.ids[lo:hi].tobytes(), self.values[lo:hi].tobytes(),
                self.ranks[lo:hi].tobytes())

    def append_bytes(self, counts: bytes, ids: bytes, values: bytes, ranks: bytes) -> None:
        self._writable()
        ends = itertools.accumulate(array("i", counts), initial=len(self.ids))
        next(ends)
        self.ends.extend(ends)
        self.ids.frombytes(ids)
        self.values.frombytes(values)
        self.ranks.frombytes(ranks)

    def view(self) -> LogprobRows:
        """The rows held now, read-only, O(1): later appends do not show in it."""
        v = LogprobRows.__new__(LogprobRows)
        v.ids, v.values, v.ranks, v.ends, v.texts = (self.ids, self.values, self.ranks,
                                                     self.ends, self.texts)
        v._n = len(self)
        return v

    def prefix(self, n: int) -> LogprobRows:
        """A new owner of a copy of the first n rows."""
        rows = LogprobRows(self.texts)
        hi = self.ends[n - 1] if n else 0
        rows.ids, rows.values, rows.ranks = self.ids[:hi], self.values[:hi], self.ranks[:hi]
        rows.ends = self.ends[:n]
        return rows

    # -- the list-like read ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ends) if self._n is None else self._n

    def _row(self, i: int) -> dict[int, Logprob]:
        ids, values, ranks, text = self.ids, self.values, self.ranks, self.texts
        entry: dict[int, Logprob] = {}
        for c in range(self.ends[i - 1] if i else 0, self.ends[i]):
            tid = ids[c]
            if tid not in entry:  # the sampled token keeps its own rank when it is also top-k
                entry[tid] = Logprob(values[c], ranks[c] or None, text(tid) if text else None)
        return entry

    @overload
    def __getitem__(self, i: int) -> dict[int, Logprob]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[int, Logprob]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[dict[int, Logprob],
                                                         list[dict[int, Logprob]]]:
        n = len(self)
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError("LogprobRows index out of range")
        return self._row(i if i >= 0 else n + i)

    def __iter__(self) -> Iterator[dict[int, Logprob]]:
        return map(self._row, range(len(self)))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable content, as a list

    def __repr__(self) -> str:
        return repr(list(itertools.islice(self, 3)))[:-1] + (", ...]" if len(self) > 3 else "]")

    def __add__(self, other: Sequence[dict[int, Logprob]]) -> list[dict[int, Logprob]]:
        return list(self) + list(other)

    def __reduce__(self) -> tuple[type, tuple[list[dict[int, Logprob]]]]:
        return list, (list(self),)
