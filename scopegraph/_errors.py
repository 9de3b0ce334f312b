"""The error hierarchy. Every error says what went wrong, where, and what to do instead.

Messages follow rustc's borrow diagnostics: a headline naming the place, then one line per
borrow or use that takes part, then a ``help:`` line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal


class ScopeGraphError(Exception):
    """Base class of every error scopegraph raises on bad input or a failed driver call."""

    # Pickled (multiprocessing, pytest-xdist, a rank's error sent to another) as its message and
    # fields: subclasses whose __init__ builds the message from fields could not be rebuilt from
    # `args`, which holds the message only.
    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), str(self), self.__dict__)


class NotAGraphNodeError(ScopeGraphError, TypeError):
    """``Scope.record`` got something that is not a graph node (an allocation op, or not an op)."""


class NotCopyableError(ScopeGraphError, TypeError):
    """``copy.copy``, ``copy.deepcopy`` or ``pickle`` of an object that stands for device state of
    this process (a tensor's memory, a graph's executable). A ``TypeError`` too, as pickle's own
    refusals are."""


def not_copyable(what: str, help: str) -> NotCopyableError:
    return NotCopyableError(
        diagnostic(
            f"cannot copy or pickle {what}",
            ["it stands for device state of this process, which a copy would share or lose"],
            help=help,
        )
    )


class BorrowError(ScopeGraphError):
    """One op borrows overlapping memory mutably twice, or mutably and shared; or writes frozen memory."""


class FrozenExportError(BorrowError, BufferError):
    """A frozen tensor was asked for in a form that a consumer could take as writable memory: a
    DLPack export without ``copy=False`` or ``copy=True`` (torch and CuPy ignore DLPack's read-only
    flag), an unversioned DLPack capsule (DLPack < 1.0 cannot say read-only), or
    ``__cuda_array_interface__`` (CuPy ignores its read-only field). A ``BufferError`` too, which
    is what DLPack producers raise for an export they cannot make."""

    @classmethod
    def refusing(
        cls, tensor_name: str, via: Literal["dlpack", "dlpack 0.x", "__cuda_array_interface__"]
    ) -> FrozenExportError:
        """The error for exporting frozen ``tensor_name`` ``via`` "dlpack" (a DLPack 1.x request),
        "dlpack 0.x" or "__cuda_array_interface__". Built here so that the exception keeps a plain
        message (picklable)."""
        notes = [f"`{tensor_name}` is frozen: graphs and PDL kernels rely on its bytes never changing"]
        alias = f"torch.from_dlpack({tensor_name}, copy=False)"
        copy = f"for a writable copy: torch.from_dlpack({tensor_name}, copy=True)"
        if via == "dlpack":
            headline = f"cannot export frozen `{tensor_name}` through DLPack without copy=False or copy=True"
            notes.append("its capsule says read-only, but torch and CuPy ignore that: their default import would write")
            hint = f"to read it without a copy: {alias} (numpy keeps it read-only; torch and CuPy cannot, so never "
            hint += f"write through it); {copy}"
        elif via == "dlpack 0.x":
            headline = f"cannot export frozen `{tensor_name}` as an unversioned DLPack capsule"
            notes.append("the consumer gave no max_version (DLPack < 1.0): such a capsule cannot say read-only")
            hint = f"use a consumer of DLPack 1.x (current numpy, torch and CuPy) with copy=False: {alias}; {copy}"
        else:
            headline = f"cannot export frozen `{tensor_name}` through __cuda_array_interface__"
            notes.append("the interface says read-only, but CuPy ignores that: cupy.asarray would write")
            hint = f"import it through DLPack instead: cupy.from_dlpack({tensor_name}, copy=False) is a read-only "
            hint += f"alias (never write through it); {copy}"
        return cls(diagnostic(headline, notes, help=hint))


class LifetimeError(ScopeGraphError):
    """A freed tensor is used, a pinned tensor is freed, or a closed graph is used."""


class SignatureError(ScopeGraphError):
    """Arguments do not match an op's declaration (count, kind, dtype, rank, device, size)."""


class ExportError(SignatureError, BufferError):
    """A DLPack export the tensor cannot make as asked: to another device than its own. A
    ``BufferError`` too, which is what DLPack consumers expect of a producer that cannot export."""


class ExportArgumentError(ExportError, TypeError):
    """``__dlpack__`` was given an argument DLPack does not define. A ``TypeError`` too, as Python
    raises for an unknown keyword: consumers take it to mean an older producer, and ask again
    without the argument."""


class NoHostReferenceError(SignatureError):
    """A kernel without a ``@k.host`` reference was run or recorded on the host backend."""


class BoundsError(SignatureError, IndexError):
    """An index or an access is outside a tensor: a row index, or a host reference that reads or
    writes past the view it was given (which on a GPU would be an illegal address)."""


class HostReferenceError(ScopeGraphError):
    """A kernel's host reference, or a captured region's host callable, raised an error of its own
    when the host backend ran it (the exception is its ``__cause__``): the user's numpy model of the
    work failed, not an access past a tensor (that is a BoundsError)."""


class ScopeStateError(ScopeGraphError):
    """A scope or a stream is used in a state that does not allow it."""


class CompileError(ScopeGraphError):
    """NVRTC rejected a kernel's source. ``log`` holds the compiler's output."""

    def __init__(self, kernel_name: str, log: str, options: Iterable[str] = ()) -> None:
        self.kernel_name = kernel_name
        self.log = log = log.replace("\0", "")  # NVRTC's log ends in a C string's NUL
        opts = " ".join(options)
        super().__init__(
            f"NVRTC could not compile kernel `{kernel_name}`"
            + (f" (options: {opts})" if opts else "")
            + f"\n{log.strip()}\n"
            "help: fix the CUDA C++ source above; the log names each line NVRTC rejected"
        )


class PdlWaitError(CompileError):
    """A kernel declared ``pdl=True`` never waits for its predecessors (DESIGN.md section 7).

    Compiling a ``pdl=True`` kernel for sm_90 or later checks that ``griddepcontrol.wait`` (what
    ``cudaGridDependencySynchronize()`` emits) is in the compiled code of its entry point or of a
    device function the entry calls. A programmatic edge starts such a kernel while its
    predecessors still run, so one that never waits reads their outputs before they are written.
    The check is by presence, not control flow: it catches a kernel that never waits, not one that
    waits too late, only in some threads, or only on some paths (such as an early ``return``
    before the wait). Those break the contract too: scopegraph relies on a finished PDL kernel
    having waited, for ordering what comes after it (it leaves out edges that this implies).
    Below sm_90 the check does not run (no edge is programmatic there). ``kernel_name`` and
    ``arch`` say which compilation was refused."""

    def __init__(self, kernel_name: str, arch: str, notes: Iterable[str] = (), found: str | None = None) -> None:
        self.kernel_name = kernel_name
        self.arch = arch
        self.log = f"no griddepcontrol.wait reachable from the entry point of `{kernel_name}` ({arch})"
        ScopeGraphError.__init__(
            self,
            diagnostic(
                f"kernel `{kernel_name}` is declared pdl=True but never waits for its predecessors "
                f"({found or f'compiled for {arch}, its code has no griddepcontrol.wait'})",
                [
                    "a programmatic edge starts it while its predecessors still run: "
                    "without the wait it would read their outputs before they are written",
                    *notes,
                ],
                help="call cudaGridDependencySynchronize() (declared by scopegraph for a source that includes "
                "nothing, else by <cuda_device_runtime_api.h>) or "
                'asm volatile("griddepcontrol.wait;" ::: "memory") in every thread, on every path (an early '
                "return too), before it reads its predecessors' outputs and before it exits, or drop pdl=True",
            ),
        )


# Errors after which the CUDA context is unusable: every later call in the process fails.
STICKY_RESULTS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_TRAP",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    }
)


# What a user can do about a failed driver call, by its CUresult: the help line of a CudaError
# whose message does not bring its own. Results missing here are not the user's to fix.
CUDA_ADVICE = {
    "CUDA_ERROR_NO_DEVICE": "run on the host backend: sg.device('host'), or sg.device(), which picks it when no GPU "
    "is found; `python -m scopegraph info` shows the driver and GPUs that scopegraph sees",
    "CUDA_ERROR_INVALID_DEVICE": "name a GPU that exists (cuda:0 is the first); `python -m scopegraph info` lists them",
    "CUDA_ERROR_OUT_OF_MEMORY": "free what is no longer needed (tensor.free(), graph.close()) or use smaller sizes; "
    "nvidia-smi shows what other processes hold on the GPU",
    "CUDA_ERROR_INSUFFICIENT_DRIVER": "update the NVIDIA driver, or install the cuda-bindings release of the driver's "
    "CUDA version; `python -m scopegraph info` shows both",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "NVRTC is newer than the driver: update the NVIDIA driver, or install the "
    "NVRTC of the driver's CUDA version; `python -m scopegraph info` shows both",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "the driver's kernel module and libcuda differ: reboot, or reinstall "
    "the driver",
    "CUDA_ERROR_DEVICES_UNAVAILABLE": "the GPU is busy or in exclusive-process mode, held by another process: use "
    "another GPU (cuda:N) or end that process; nvidia-smi shows the compute mode and the processes",
}


class CudaError(ScopeGraphError):
    """A driver call failed. ``result`` is the CUresult name, ``operation`` what was being done;
    ``context_lost`` is true after a sticky fault (the process must restart to use the GPU).
    The message ends with a ``help:`` line: ``help``, or else the advice for ``result`` (in
    ``CUDA_ADVICE``), unless ``detail`` brings its own."""

    def __init__(
        self, operation: str, result: str, detail: str = "", context_lost: bool = False, help: str = ""
    ) -> None:
        self.operation = operation
        self.result = result
        self.context_lost = context_lost or result in STICKY_RESULTS
        lines = [f"{operation} failed: {result}"]
        if detail.strip():
            lines.append(detail.strip())
        if self.context_lost:
            lines.append(
                "the CUDA context is lost: a kernel faulted, and every later CUDA call in this process fails\n"
                "help: restart the process; run the failing kernel under compute-sanitizer to find the bad access"
            )
        else:
            advice = help or CUDA_ADVICE.get(result, "")
            if advice and not any(line.startswith("help: ") for line in detail.splitlines()):
                lines.append(f"help: {advice}")
        super().__init__("\n".join(lines))


class LaunchResourceError(SignatureError, CudaError):
    """A launch that its kernel, as compiled for the device, cannot take: more threads a block than
    its ``__launch_bounds__`` or its registers allow, or more dynamic shared memory than its static
    shared memory leaves. Raised when the launch is run or recorded, before the driver is asked
    (which would refuse it with ``result``), so it is a SignatureError and a CudaError both."""

    def __init__(self, operation: str, result: str, message: str) -> None:
        Exception.__init__(self, message)
        self.operation = operation
        self.result = result  # what the driver gives for such a launch
        self.context_lost = False


def _rebuilt(cls: type[BaseException], message: str, fields: dict[str, Any]) -> BaseException:
    """An error of ``cls`` with ``message`` and ``fields``, without its __init__ (unpickling)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(fields)
    return error


def diagnostic(headline: str, notes: Iterable[str] = (), help: str = "") -> str:
    """Format a rustc-style message: headline, ``|``-prefixed notes, then ``help:``."""
    lines = [headline]
    lines.extend(f"   | {note}" for note in notes)
    if help:
        lines.append(f"help: {help}")
    return "\n".join(lines)


def host_code_failed(what: str, exc: Exception, notes: list[str], bounds_help: str) -> ScopeGraphError:
    """The error for user code the host backend ran (``what``: a kernel's host reference, a
    region's host callable) that raised ``exc``: a BoundsError for an access past a view, a write
    to a read-only one, or views whose shapes differ (numpy's IndexError, and its read-only and
    broadcast errors); a HostReferenceError for anything else it raised."""
    text = str(exc)
    if isinstance(exc, IndexError) or (isinstance(exc, ValueError) and ("broadcast" in text or "read-only" in text)):
        return BoundsError(diagnostic(f"{what} failed: {exc}", notes, help=bounds_help))
    return HostReferenceError(
        diagnostic(
            f"{what} raised {type(exc).__name__}: {exc}",
            notes,
            help="the error is the host code's own (its traceback is this error's cause): fix that code",
        )
    )
