# Mut is final (a subclass could smuggle a second borrow past the checks), and it borrows tensors
# only: a Mut[object] is no type, and a Mut[Tensor] is not one.
from scopegraph import Mut, Tensor


class MyMut(Mut[Tensor]): ...  # E: misc


def takes_any(m: Mut[object]) -> None: ...  # E: type-var


def give(x: Tensor) -> None:
    takes_any(x.mut())  # E: arg-type
