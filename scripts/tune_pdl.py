"""Tuning the PDL library kernels on a GPU (issue 11): variants of the seed model's kernels, in its
fused form (2 kernels a layer) and its 4-kernel form (rms_norm, matvec, matvec, axpy: PyTorch's
kernel count), each with programmatic edges on and off, all timed interleaved in one pass against
PyTorch's CUDA graph of the same 4 kernels and the read-only streaming ceiling.

    PYTHONPATH=. python3 scripts/tune_pdl.py            # the variant table
    PYTHONPATH=. python3 scripts/tune_pdl.py --trace    # and a timeline of a few layers
    PYTHONPATH=. python3 scripts/tune_pdl.py --host     # a dry run on the host backend (no GPU)
    git show HEAD:scopegraph/kernels/library.cu > /tmp/base.cu
    PYTHONPATH=. python3 scripts/tune_pdl.py --baseline /tmp/base.cu   # also that version's cases

The variants are the library's own source compiled with macros (SG_MATVEC_BOUNDS, SG_WEIGHT_LOAD,
SG_LATE_TRIGGER) or launched with other blocks; ``--baseline`` adds the cases marked ``base``,
built from another version of library.cu, so an old and a new library are timed in one run
(launched as the current library's helpers launch: a version with other matvec blocks, such as
the warp-per-row kernels before pass 24 of benchmarks/NOTES.md, needs its own launch shapes).
benchmarks/NOTES.md records what was tried, what was chosen and why.

``--trace`` compiles the library with a timestamp (``%globaltimer``) at each block's start (its
trigger), at its wait's release and at thread 0's exit, replays one token and prints, for each
kernel of a few layers, when its blocks started, when their waits returned, when the last one
left, and how long after that the next kernel's wait returned.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._cli.bench._model import _torch, bandwidths
from scopegraph._cli.bench._timing import Side, interleaved
from scopegraph._cli.seed_model import Config, LayerStack, reference_forward, relative_error
from scopegraph._kernel import Kernel


class Case(NamedTuple):
    label: str
    form: str  # "fused" (2 kernels a layer) or "kernels" (4)
    macros: tuple[str, ...] = ()
    axpy: int = 0  # axpy's block (0: the library's, library.AXPY_BLOCK)
    # Threads a matvec block (0: the *_op helpers' choice, a float4 of the row each, up to 512);
    # fewer take a row in more passes, the later ones loaded after the wait.
    threads: int = 0
    base: bool = False  # every kernel from the --baseline source (another version of library.cu)
    # Memory synchronization domains the graph's kernel nodes cycle through (0: all in the default
    # one): a kernel's completion flush orders only its own domain's memory operations, so it
    # need not wait for the weight loads of the next kernels in flight beside it.
    domains: int = 0


NO_BOUNDS = ("SG_MATVEC_BOUNDS=",)  # no register cap
ONE_BLOCK = ("SG_MATVEC_BOUNDS=__launch_bounds__(512,1)",)  # one matvec block an SM: no room for the next beside it
LDG = ("SG_WEIGHT_LOAD=__ldg",)  # weights as read-only data, kept in L2
LATE = ("SG_LATE_TRIGGER=1",)  # dependents triggered after the wait

# d=2048 x 22: what each case changes from the library's defaults. The baseline cases (with
# --baseline) launch axpy with 256 threads, as the library did before AXPY_BLOCK.
CASES: list[Case] = [
    Case("fused, baseline", "fused", base=True),
    Case("fused", "fused"),
    Case("4k, baseline", "kernels", axpy=256, base=True),
    Case("4k", "kernels"),
    Case("4k, axpy 256 threads", "kernels", axpy=256),  # why library.AXPY_BLOCK is 512
    Case("fused, no register cap", "fused", NO_BOUNDS),  # why the matvec family caps its registers
    Case("4k, no register cap", "kernels", NO_BOUNDS),
    Case("fused, one matvec block an SM", "fused", ONE_BLOCK),
    # Weights loaded as read-only data (__ldg) rather than evict-first (ld.global.cs): why they are not.
    Case("fused, weights by __ldg", "fused", LDG),
    Case("4k, weights by __ldg", "kernels", LDG),
    Case("fused, dependents triggered after the wait", "fused", LATE),
    # Half a row a pass (256 threads): the second half of each row loaded after the wait.
    Case("fused, 256 threads a block", "fused", threads=256),
    Case("4k, 256 threads a block", "kernels", threads=256),
    Case("fused, 2 sync domains", "fused", domains=2),
    Case("fused, 4 sync domains", "fused", domains=4),
]
TRACED = ("4k", "fused")
# d=512 x 22 (launch-bound: the weights nearly fit in L2).
SMALL_CASES: list[Case] = [
    Case("fused, baseline", "fused", base=True),
    Case("fused", "fused"),
    Case("4k, baseline", "kernels", axpy=256, base=True),
    Case("4k", "kernels"),
    Case("4k, axpy 256 threads", "kernels", axpy=256),
    Case("fused, weights by __ldg", "fused", LDG),
    Case("4k, weights by __ldg", "kernels", LDG),
    Case("fused, 64 threads a block", "fused", threads=64),
]
BASELINE: list[str | None] = [None]  # --baseline FILE: its text


def variant(k: Kernel[Any], macros: tuple[str, ...], source: str | None = None) -> Kernel[Any]:
    """``k`` built with more macros (added to those of its own options), or from another source."""
    if not macros and source is None:
        return k
    options: dict[str, Any] = dict(k.options)
    own: Any = options.pop("define_macro", ())
    pairs: list[Any] = [tuple(own)] if own and isinstance(own[0], str) else list(own)  # one pair, or a list
    pairs += [tuple(m.split("=", 1)) for m in macros]
    if pairs:  # cuda.core: (name, value), or a list of them; a later one of a name wins
        options["define_macro"] = pairs[0] if len(pairs) == 1 else pairs
    return k.rebuilt(source=source, options=tuple(sorted(options.items())))


def kernels_of(form: str, macros: tuple[str, ...], d: int, source: str | None = None) -> list[Any]:
    """The case's kernels at width d, built with the case's macros or source."""
    if form == "fused":
        return [variant(library.rms_norm_matvec, macros, source), variant(library.matvec_add, macros, source)]
    return [
        variant(library.rms_norm.generics(library.rms_norm_block(d)), macros, source),
        variant(library.matvec, macros, source),
        variant(library.axpy, macros, source),
    ]


def form_ops(model: LayerStack, case: Case, source: str | None = None) -> tuple[list[Any], list[Any]]:
    """The ops of one forward pass with the case's kernels, and those kernels."""
    form, macros, axpy_block = case.form, case.macros, case.axpy
    cfg, hidden = model.cfg, model.hidden
    if case.base:
        assert BASELINE[0] is not None, "a baseline case needs --baseline FILE"
        source = BASELINE[0] if source is None else traced_source(BASELINE[0])
    ks = kernels_of(form, macros, cfg.d, source)
    ops: list[Any] = []
    for w, b in zip(model.weights, model.buffers, strict=True):
        n, k = w.wq.shape
        grid, block = -(-n // library.MATVEC_ROWS), case.threads or library.matvec_block(k)
        if form == "fused":
            ops += [
                ks[0][grid, block](b.q.mut(), hidden, w.norm_w, w.wq, cfg.eps, n, k),
                ks[1][grid, block](hidden.mut(), b.q, w.wo, n, k),
            ]
            continue
        bs = int(ks[0].template_args[0])
        ab = axpy_block or library.AXPY_BLOCK
        ops += [
            ks[0][1, bs](b.norm.mut(), hidden.view((1, cfg.d)), w.norm_w, cfg.eps, cfg.d),
            ks[1][grid, block](b.q.mut(), b.norm, w.wq, n, k),
            ks[1][grid, block](b.o.mut(), b.q, w.wo, n, k),
            ks[2][-(-cfg.d // ab), ab](hidden.mut(), b.o, 1.0, cfg.d),
        ]
    return ops, ks


def _resources(dev: sg.Device, k: Kernel[Any]) -> str:
    attributes = dev.backend._load(k).fn.attributes[dev.index]  # type: ignore[attr-defined]
    return f"{k.cpp_name} {attributes.num_regs} regs, {attributes.local_size_bytes} B local"


def graph(stream: sg.Stream, ops: list[Any], pdl: bool, domains: int = 0) -> CudaGraph:
    with in_domains(domains), CudaGraph.scope(stream, pdl=pdl) as s:
        for op in ops:
            s.record(op)
    return s.graph


@contextlib.contextmanager
def in_domains(domains: int) -> Iterator[None]:
    """While a graph is built: its kernel nodes in memory synchronization domains 0, 1, ...,
    domains - 1, 0, ... in record order (cuGraphKernelNodeSetAttribute, the domain map)."""
    if not domains:
        yield
        return
    from cuda.bindings import driver

    from scopegraph._backends import _cuda

    original = _cuda.CudaBackend._add_node
    count = [0]

    def add_node(self: Any, parent: Any, op: Any, in_body: bool) -> Any:
        node = original(self, parent, op, in_body)
        if type(op) is sg.KernelLaunch:
            value = driver.CUkernelNodeAttrValue()
            value.memSyncDomainMap.default_ = value.memSyncDomainMap.remote = count[0] % domains
            count[0] += 1
            attribute = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
            (err,) = driver.cuGraphKernelNodeSetAttribute(node.handle, attribute, value)
            assert err == driver.CUresult.CUDA_SUCCESS, err
        return node

    _cuda.CudaBackend._add_node = add_node  # type: ignore[method-assign]
    try:
        yield
    finally:
        _cuda.CudaBackend._add_node = original  # type: ignore[method-assign]


def run_size(dev: sg.Device, stream: sg.Stream, d: int, cases: list[Case], read_only: float) -> None:
    cfg = Config(d=d, n_layers=22)
    model = LayerStack(dev, cfg)
    x0 = np.random.default_rng(5).standard_normal(d).astype(np.float32)
    start = dev.from_numpy(x0)
    want = reference_forward(model.host_weights, x0, cfg.eps, 3)
    sides: dict[str, Side] = {}
    checks = {}
    graphs = []
    for case in cases:
        ops, ks = form_ops(model, case)
        if dev.is_cuda:  # registers, and local memory (spills), of each kernel as the case builds it
            print(f"d={d:4} {case.label:<40} " + ", ".join(_resources(dev, k) for k in ks), flush=True)
        got = {}
        for pdl in (True, False):
            g = graph(stream, ops, pdl, case.domains)
            graphs.append(g)
            g.update(sg.memcpy(model.hidden.mut(), start))
            for _ in range(3):
                g.launch()
            g.sync()
            got[pdl] = model.hidden.numpy()
            sides[f"{case.label}|{pdl}"] = (g.launch, g.sync, 64)
        checks[case.label] = (bool(np.array_equal(got[True], got[False])), relative_error(got[True], want))
    sides |= {k: v for k, v in _torch(model, 64, compile=False).items() if k == "torch_graph"}
    t = interleaved(sides, rounds=5, inner=3)
    torch_tok = 1 / t["torch_graph"]["wall"] if "torch_graph" in t else float("nan")
    ceiling = read_only / cfg.weight_bytes
    print(f"d={d} x 22: torch CUDA graph (4 kernels a layer) {torch_tok:.0f} tok/s; read-only ceiling {ceiling:.0f}")
    for case in cases:
        on, off = 1 / t[f"{case.label}|True"]["wall"], 1 / t[f"{case.label}|False"]["wall"]
        same, err = checks[case.label]
        print(
            f"d={d:4} {case.label:<40} on {on:7.0f} tok/s ({1e6 / on:6.1f} us, {on / ceiling:6.1%} of read-only, "
            f"{on / torch_tok:5.3f}x torch graph)  off {off:7.0f}  on/off {on / off:4.2f}  identical {same}  "
            f"err {err:.1e}  spread {t[f'{case.label}|True']['spread']:.1%}",
            flush=True,
        )
    for g in graphs:
        g.close()
    for w in [*model.tensors(), start]:
        w.free()


# -- the timeline (--trace) ---------------------------------------------------------------------

TRACE_PRELUDE = r"""
struct SgTraceRecord { unsigned long long out, started, released, ended; unsigned block, sm; };
#define SG_TRACE_CAPACITY (1 << 16)
__device__ SgTraceRecord sg_trace[SG_TRACE_CAPACITY];
__device__ unsigned sg_trace_count;
__device__ __forceinline__ unsigned long long sg_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned sg_trace_start(const void* out) {
    unsigned slot = SG_TRACE_CAPACITY;
    if (threadIdx.x == 0) {
        slot = atomicAdd(&sg_trace_count, 1u);
        if (slot < SG_TRACE_CAPACITY) {
            unsigned sm;
            asm("mov.u32 %0, %%smid;" : "=r"(sm));
            sg_trace[slot].out = reinterpret_cast<size_t>(out);
            sg_trace[slot].started = sg_now();
            sg_trace[slot].block = blockIdx.x;
            sg_trace[slot].sm = sm;
        }
    }
    return slot;
}
__device__ __forceinline__ void sg_trace_released(unsigned slot) {
    if (threadIdx.x == 0 && slot < SG_TRACE_CAPACITY) sg_trace[slot].released = sg_now();
}
// Stamps thread 0's exit from the kernel, whichever way it returns.
struct SgTraceEnd {
    unsigned slot;
    __device__ ~SgTraceEnd() {
        if (threadIdx.x == 0 && slot < SG_TRACE_CAPACITY) sg_trace[slot].ended = sg_now();
    }
};
"""
RECORD = np.dtype(
    [("out", "<u8"), ("started", "<u8"), ("released", "<u8"), ("ended", "<u8"), ("block", "<u4"), ("sm", "<u4")]
)


def traced_source(source: str = library.SOURCE) -> str:
    body = re.sub(
        r"(?<!void )pdl_launch_dependents\(\);",
        "unsigned sg_slot = sg_trace_start(out); SgTraceEnd sg_end{sg_slot}; pdl_launch_dependents();",
        source,
    )
    body = re.sub(r"(?<!void )pdl_wait\(\);", "pdl_wait(); sg_trace_released(sg_slot);", body)
    return TRACE_PRELUDE + body


def _global(dev: sg.Device, k: Kernel[Any], name: str) -> tuple[int, int]:
    from cuda.bindings import driver

    from scopegraph._compile import compile_kernel

    code = compile_kernel(k, dev.backend.arch)  # type: ignore[attr-defined]
    handle = code.handle  # type: ignore[attr-defined]
    if isinstance(handle, driver.CUmodule):
        err, ptr, size = driver.cuModuleGetGlobal(handle, name.encode())
    else:
        err, ptr, size = driver.cuLibraryGetGlobal(handle, name.encode())
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return int(ptr), int(size)


def trace(dev: sg.Device, stream: sg.Stream, case: Case, d: int = 2048, layers: tuple[int, int] = (10, 12)) -> None:
    from cuda.bindings import driver

    cfg = Config(d=d, n_layers=22)
    model = LayerStack(dev, cfg)
    ops, ks = form_ops(model, case, traced_source())
    g = graph(stream, ops, True)
    print(f"edges {len(g.edges)}, programmatic {len(g.programmatic_edges)}")
    for _ in range(3):
        g.launch()
    g.sync()
    for k in ks:
        driver.cuMemsetD32(_global(dev, k, "sg_trace_count")[0], 0, 1)
    driver.cuCtxSynchronize()
    g.launch()
    g.sync()
    rows = []
    for k in ks:
        count = np.zeros(1, np.uint32)
        ptr, _ = _global(dev, k, "sg_trace_count")
        driver.cuMemcpyDtoH(count.ctypes.data, ptr, 4)
        n = min(int(count[0]), 1 << 16)
        recs = np.zeros(n, RECORD)
        ptr, _ = _global(dev, k, "sg_trace")
        driver.cuMemcpyDtoH(recs.ctypes.data, ptr, n * RECORD.itemsize)
        rows.append((k.cpp_name, recs))
    launches = []  # (kind, records of one launch)
    for kind, recs in rows:
        for out in np.unique(recs["out"]):
            mine = np.sort(recs[recs["out"] == out], order="started")
            cut = np.flatnonzero(np.diff(mine["started"].astype(np.int64)) > 3000) + 1  # > 3 us apart: another launch
            launches += [(kind, part) for part in np.split(mine, cut)]
    launches.sort(key=lambda kr: int(kr[1]["started"].min()))
    per_layer = len(ks) if case.form == "fused" else 4
    window = launches[layers[0] * per_layer : layers[1] * per_layer]
    stamps = np.unique(np.concatenate([r["started"] for _, r in launches]))
    tick = int(np.diff(stamps).min()) if stamps.size > 1 else 0
    t0 = int(window[0][1]["started"].min())
    total = (
        max(int(r["released"].max()) for _, r in launches) - min(int(r["started"].min()) for _, r in launches)
    ) / 1e3
    print(
        f"trace {case.label}: {len(launches)} launches, token {total:.1f} us (first start to last release), "
        f"timer tick {tick} ns"
    )
    print(
        "  kernel            blocks  start min/med/max us   released min/max us   ended max us   "
        "started before first release   last end to next release us"
    )
    for i, (kind, r) in enumerate(window):
        s = (r["started"].astype(np.int64) - t0) / 1e3
        rel = (r["released"].astype(np.int64) - t0) / 1e3
        end = (int(r["ended"].max()) - t0) / 1e3
        early = int(np.sum(r["started"] < r["released"].min()))
        gap = (int(window[i + 1][1]["released"].min()) - t0) / 1e3 - end if i + 1 < len(window) else float("nan")
        print(
            f"  {kind:<17} {len(r):6}  {s.min():6.2f} {np.median(s):6.2f} {s.max():6.2f}     "
            f"{rel.min():6.2f} {rel.max():6.2f}        {end:6.2f}          {early:6}                       {gap:5.2f}"
        )
    g.close()
    for w in model.tensors():
        w.free()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", action="store_true", help="print a timeline of a few layers first")
    parser.add_argument("--no-table", action="store_true", help="skip the timing table")
    parser.add_argument("--host", action="store_true", help="a dry run on the host backend (timings meaningless)")
    parser.add_argument("--baseline", type=Path, metavar="FILE", help="another library.cu: also its cases (base)")
    parser.add_argument("--cases", metavar="REGEX", help="only the cases whose label matches REGEX")
    args = parser.parse_args()
    if args.cases is not None:
        CASES[:] = [c for c in CASES if re.search(args.cases, c.label)]
        SMALL_CASES[:] = [c for c in SMALL_CASES if re.search(args.cases, c.label)]
    if args.baseline is not None:
        BASELINE[0] = args.baseline.read_text()
    else:
        CASES[:] = [c for c in CASES if not c.base]
        SMALL_CASES[:] = [c for c in SMALL_CASES if not c.base]
    if args.host:
        dev = sg.device("host")
        run_size(dev, dev.stream(), 64, CASES, 1.0)
        run_size(dev, dev.stream(), 32, SMALL_CASES, 1.0)
        return 0
    dev = sg.device("cuda")
    stream = dev.stream()
    t0 = time.perf_counter()
    big = Config(d=2048, n_layers=22)
    from cuda.bindings import driver

    count = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, dev.index)
    print(f"memory synchronization domains: {count[1]}")
    bw = bandwidths(dev, big.weight_bytes)
    print("bandwidths GB/s: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in bw.items()), flush=True)
    if args.trace:
        for case in (c for c in CASES if c.label in TRACED):
            try:
                trace(dev, stream, case)
            except Exception as exc:  # a diagnostic: the timing table still runs
                print(f"trace {case.label} failed: {type(exc).__name__}: {exc}")
    if not args.no_table:
        run_size(dev, stream, 2048, CASES, bw["read_only"])
        run_size(dev, stream, 512, SMALL_CASES, bw["read_only"])
    print(f"tuning done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
