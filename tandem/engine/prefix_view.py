"""A read-only view of the first n items of a list that only grows.

The API process rebuilds each request's cumulative output from the engine's deltas, and a
streaming reader takes a snapshot of it every step. Copying the token ids, origins and logprobs
into each snapshot costs O(length) a step, O(length^2) a stream; a `PrefixView` costs O(1) and
sees exactly the items the list held when it was taken (the owner only appends, and replaces the
list instead of shrinking it). Consumers slice (`view[start:]` is a real list of the tail) and
take `len`; a final output carries the real lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Iterator, TypeVar, Union, overload

T = TypeVar("T")


class PrefixView(Sequence[T]):
    __slots__ = ("_items", "_n")

    def __init__(self, items: list[T]) -> None:
        self._items = items       # appended to by its owner after this view is taken, never cut
        self._n = len(items)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[T, list[T]]:
        if isinstance(i, slice):
            if i.step is not None and i.step < 0:
                return self._items[:self._n][i]
            start, stop, step = i.indices(self._n)  # clipped to the view: copies only the slice
            return self._items[start:stop:step]
        if not -self._n <= i < self._n:
            raise IndexError("PrefixView index out of range")
        return self._items[i if i >= 0 else self._n + i]

    def __iter__(self) -> Iterator[T]:
        return itertools.islice(self._items, self._n)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable content, as a list

    def __repr__(self) -> str:
        return repr(self._items[:self._n])

    def __add__(self, other: Sequence[T]) -> list[T]:
        return list(self) + list(other)
