"""Borrows and the rules that hold within one op.

A borrow is one argument's claim on a range of device addresses: shared (the op reads it) or
mutable (``x.mut()``: the op writes it). Addresses, not wrappers, decide conflicts, so views and
foreign wrappers of the same memory conflict exactly where their bytes overlap, and an empty range
conflicts with nothing.

Within one op (:func:`check_borrows`): every tensor is alive, no mutable borrow touches frozen
bytes, and no mutable borrow overlaps any other borrow of the op. Between ops there is no conflict:
the dependency tracker (``_tracker``) orders them by these same ranges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import BorrowError, diagnostic

if TYPE_CHECKING:
    from ._allocation import Allocation
    from ._tensor import Tensor


class Borrow:
    """One argument's claim on the device addresses [start, end) of a tensor."""

    __slots__ = ("alloc", "end", "mutable", "param", "start", "tensor")

    def __init__(self, tensor: Tensor, mutable: bool, param: str) -> None:
        alloc = tensor._alloc  # tensor.allocation, without the property call (a hot path)
        self.tensor = tensor
        self.alloc: Allocation = alloc
        self.start = start = alloc.address + tensor.offset
        self.end = start + tensor.nbytes
        self.mutable = mutable
        self.param = param

    @property
    def empty(self) -> bool:
        return self.start == self.end

    def overlaps(self, other: Borrow) -> bool:
        """Do the two borrows share a byte? Empty ranges share none."""
        return (
            self.start < other.end
            and other.start < self.end
            and self.start < self.end
            and other.start < other.end
            and self.alloc.device is other.alloc.device
        )

    def describe(self) -> str:
        kind = "mutably" if self.mutable else "as shared"
        offset = self.tensor.offset
        span = f"bytes {offset}..{offset + self.tensor.nbytes}"
        return f"`{self.param}` borrows `{self.tensor.name}` {kind} ({span} of allocation `{self.alloc.label}`)"


def check_frozen(op_name: str, borrows: list[Borrow]) -> None:
    """No mutable borrow may touch frozen bytes, through whichever wrapper froze them.

    Checked when an op is built, and again when it is run or recorded (``freeze()`` may come
    between)."""
    for b in borrows:
        if b.mutable and b.alloc.region.frozen and b.alloc.frozen_overlap(b.start, b.end):
            raise BorrowError(
                diagnostic(
                    f"cannot borrow `{b.tensor.name}` as mutable in `{op_name}`: it is frozen",
                    [b.describe(), f"`{b.tensor.name}` was made read-only by freeze()"],
                    help="write into a separate buffer; frozen tensors (weights) can only be read",
                )
            )


def check_borrows(op_name: str, borrows: list[Borrow]) -> None:
    """The in-op rules: live memory, no write to frozen memory, no mutable overlap."""
    frozen = False
    for b in borrows:
        alloc = b.alloc
        if alloc.freed:
            b.tensor.check_alive()
        if b.mutable and alloc.region.frozen:
            frozen = True
    if frozen:  # some region holds frozen bytes: look closer (raises if a write touches them)
        check_frozen(op_name, borrows)
    n = len(borrows)
    for i in range(n - 1):
        a = borrows[i]
        a_start, a_end, a_mutable = a.start, a.end, a.mutable
        for j in range(i + 1, n):
            b = borrows[j]
            # The range test first (cheap, and false for most pairs); overlaps() has the rest.
            if b.start < a_end and a_start < b.end and (a_mutable or b.mutable) and a.overlaps(b):
                raise aliasing_error(op_name, a, b)


def aliasing_error(
    op_name: str,
    a: Borrow,
    b: Borrow,
    help: str = "give the op separate buffers (or disjoint views) for what it writes and what it reads; "
    "copy first with sg.memcpy if you need the old contents",
) -> BorrowError:
    first, second = (a, b) if a.mutable else (b, a)
    if second.mutable:
        head = f"cannot borrow `{second.tensor.name}` as mutable more than once at a time in `{op_name}`"
    else:
        head = (
            f"cannot borrow `{second.tensor.name}` as immutable because it is also borrowed as mutable in `{op_name}`"
        )
    notes = [f"mutable borrow: {first.describe()}", f"conflicting borrow: {second.describe()}"]
    if first.alloc is not second.alloc:
        notes.append(
            f"`{first.tensor.name}` and `{second.tensor.name}` wrap the same device memory "
            f"(addresses {max(first.start, second.start):#x}..{min(first.end, second.end):#x})"
        )
    return BorrowError(diagnostic(head, notes, help=help))
