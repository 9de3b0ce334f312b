"""Lookups in a ``SortedDict`` of disjoint half-open intervals, keyed by start, each value with an
``end``: what the memory map (regions of allocations) and the dependency tracker (segments of
accesses) both keep."""

from __future__ import annotations

from typing import Protocol, TypeVar

from sortedcontainers import SortedDict


class Interval(Protocol):
    end: int


V = TypeVar("V", bound=Interval)


def overlapping(intervals: SortedDict[int, V], start: int, end: int) -> list[V]:
    """The intervals that share a point with [start, end), in address order: O(log n + k)."""
    found: list[V] = []
    i = intervals.bisect_left(start) - 1  # the last interval that starts before `start`
    if i >= 0:
        before = intervals.peekitem(i)[1]
        if before.end > start:
            found.append(before)
    found.extend(intervals[k] for k in intervals.irange(start, end, inclusive=(True, False)))
    return found
