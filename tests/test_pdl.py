"""Programmatic dependent launch (issue 11, DESIGN.md section 7): which edges become programmatic,
the declaration's checks, the library kernels' PDL structure, and on a GPU that results are the
same with PDL on and off and that a kernel which forgets to wait is caught."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library
from scopegraph._cli.bench._chain import Chain
from scopegraph._cli.seed_model import FORMS, Config, LayerStack, reference_forward, relative_error

from .helpers import assert_stream_usable

NDArray = np.ndarray[Any, np.dtype[Any]]

# -- helper kernels ----------------------------------------------------------------------------

HELPERS = (
    library.SOURCE
    + r"""
// dst = src, written late: block 0 spins for spin_ns first. Triggers its dependents at entry, so
// a programmatic dependent runs its pre-wait part while this kernel spins.
extern "C" __global__ void slow_copy(float* __restrict__ dst, const float* __restrict__ src, int n, long long spin_ns) {
    pdl_launch_dependents();
    pdl_wait();
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)spin_ns);
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

// dst = src after waiting: a correct PDL kernel.
extern "C" __global__ void copy_waits(float* __restrict__ dst, const float* __restrict__ src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_wait();
    if (i < n) dst[i] = src[i];
}

// dst = src WITHOUT waiting, yet declared pdl=True below: the bug the tests must catch.
extern "C" __global__ void copy_forgets(float* __restrict__ dst, const float* __restrict__ src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// dst = src, read BEFORE the wait, yet declared pdl=True below: the bug the GPU test must catch.
// (It does wait, after the read, so the compile-time check that a pdl=True kernel waits at all,
// tests/test_pdl_wait_check.py, lets it through; copy_forgets it refuses.)
extern "C" __global__ void copy_reads_early(float* __restrict__ dst, const float* __restrict__ src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? src[i] : 0.f;
    pdl_wait();
    if (i < n) dst[i] = v;
}

// a = b = value: one kernel writing two tensors.
extern "C" __global__ void fill2(float* __restrict__ a, float* __restrict__ b, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    pdl_wait();
    if (i < n) a[i] = b[i] = value;
}
"""
)


@sg.kernel(HELPERS, touches={"dst": "n", "src": "n"}, pdl=True)
def slow_copy(dst: Mut[Tensor], src: Tensor, n: sg.i32, spin_ns: sg.i64) -> None: ...


@sg.kernel(HELPERS, touches={"dst": "n", "src": "n"}, pdl=True)
def copy_waits(dst: Mut[Tensor], src: Tensor, n: sg.i32) -> None: ...


@sg.kernel(HELPERS, touches={"dst": "n", "src": "n"}, pdl=True)
def copy_forgets(dst: Mut[Tensor], src: Tensor, n: sg.i32) -> None: ...


@sg.kernel(HELPERS, touches={"dst": "n", "src": "n"}, pdl=True)
def copy_reads_early(dst: Mut[Tensor], src: Tensor, n: sg.i32) -> None: ...


@sg.kernel(HELPERS, touches={"a": "n", "b": "n"}, pdl=True)
def fill2(a: Mut[Tensor], b: Mut[Tensor], value: sg.f32, n: sg.i32) -> None: ...


@slow_copy.host
@copy_waits.host
@copy_forgets.host
@copy_reads_early.host
def _copy(dst: NDArray, src: NDArray, n: np.int32, *spin: object) -> None:
    dst.reshape(-1)[:n] = src.reshape(-1)[:n]


@fill2.host
def _fill2(a: NDArray, b: NDArray, value: np.float32, n: np.int32) -> None:
    a.reshape(-1)[:n] = value
    b.reshape(-1)[:n] = value


@sg.kernel(
    'extern "C" __global__ void plain(float* out, int n) { if (threadIdx.x < n) out[threadIdx.x] = 1.0f; }',
    touches={"out": "n"},
)
def plain(out: Mut[Tensor], n: sg.i32) -> None: ...


@plain.host
def _plain(out: NDArray, n: np.int32) -> None:
    out.reshape(-1)[:n] = 1.0


def rand(rng: np.random.Generator, *shape: int) -> NDArray:
    return rng.standard_normal(shape).astype(np.float32)


# -- which edges are programmatic (every backend) ----------------------------------------------


def test_edges_between_pdl_kernels_are_programmatic_and_no_others(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, y, z, u, v, w = (sg_device.zeros((64,), name=n) for n in "xyzuvw")
    with CudaGraph.scope(sg_stream) as s:
        a = s.record(library.fill_op(x.mut(), 1.0))  # 0
        b = s.record(library.add_op(y.mut(), x, x))  # 1: pdl after pdl
        c = s.record(sg.memcpy(z.mut(), y))  # 2: a memcpy: full edges in and out
        d = s.record(library.axpy_op(x.mut(), z, 2.0))  # 3: after the memcpy (full) and after add, which read x (pdl)
        e = s.record(plain[1, 64](y.mut(), 64))  # 4: not a PDL kernel: full
        f = s.record(library.add_op(u.mut(), y, y))  # 5: a PDL kernel whose one predecessor is not: full
        g_ = s.record(sg.memcpy(v.mut(), u))  # 6
        h = s.record(library.add_op(w.mut(), v, v))  # 7: a PDL kernel whose one predecessor is a memcpy: full
    assert a.programmatic == frozenset() and b.programmatic == {0} and c.programmatic == frozenset()
    assert d.deps == {1, 2} and d.programmatic == {1}
    assert e.deps == {2} and e.programmatic == frozenset()
    assert f.deps == {4} and g_.deps == {5} and h.deps == {6}
    assert f.programmatic == h.programmatic == frozenset()
    with s.graph as g:
        assert g.edges == [(0, 1), (1, 2), (1, 3), (2, 3), (2, 4), (4, 5), (5, 6), (6, 7)]
        pdl = bool(getattr(g.executable, "pdl", False))  # sm_90+ GPU
        assert g.programmatic_edges == ([(0, 1), (1, 3)] if pdl else [])
        dashed = [line for line in g.to_dot().splitlines() if "dashed" in line]
        assert len(dashed) == (2 if pdl else 0)
        g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 5.0)  # 1 + 2 * (1 + 1)
    np.testing.assert_array_equal(w.numpy(), 4 * y.numpy())


def test_edges_out_of_a_join_node_are_full(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A join the tracker adds (the second partial write after many readers) is not a kernel: the PDL
    kernel after it gets a full edge from it, at the top level and in a loop body alike."""
    x, flag = sg_device.zeros((64,), name="x"), sg_device.zeros((1,), sg.i32, name="flag")
    outs = [sg_device.zeros((64,), name=f"o{i}") for i in range(10)]

    def readers_then_two_writes(into: sg.Scope | sg.Body) -> tuple[sg.RecordedNode, tuple[sg.RecordedNode, ...]]:
        for out in outs:  # more readers of x than a write waits for one by one twice
            into.record(library.add_op(out.mut(), x, x))
        into.record(library.fill_op(x[:32].mut(), 2.0))  # waits for each reader
        into.record(library.fill_op(x[32:].mut(), 2.0))  # waits for a join of them
        return into.nodes[-1], into.nodes

    with CudaGraph.scope(sg_stream) as s:
        at_top = readers_then_two_writes(s)
        with s.while_(flag) as body:
            in_body = readers_then_two_writes(body)
    for node, nodes in (at_top, in_body):
        (join,) = (d for d in node.deps if isinstance(nodes[d].op, sg.Join))
        assert node.programmatic == node.deps - {join}
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 2.0)


def test_a_pdl_kernel_reading_early_what_its_predecessor_writes_gets_a_full_edge(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    w = sg_device.zeros((8, 8), name="w")
    x, out = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="out")
    with CudaGraph.scope(sg_stream) as s:
        s.record(fill2[1, 64](w.view((64,)).mut(), sg_device.zeros((64,)).mut(), 1.0, 64))  # writes w
        s.record(library.fill_op(x.mut(), 2.0))
        mv = s.record(library.matvec_op(out.mut(), x, w))  # w is read before the wait
    assert mv.deps == {0, 1} and mv.programmatic == {1}
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 16.0)


def test_in_program_order_a_pdl_kernel_that_loads_early_gets_full_edges(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """In program order the matvec's one predecessor is node 1, not node 0, the writer of the w it
    loads before its wait: its edge was programmatic, so it could start (node 1 triggers at entry)
    while node 0 still wrote w. Its edges are full now; a kernel that loads nothing early, or
    loads early only what the recording never writes (frozen weights), keeps programmatic ones."""
    ones = sg_device.from_numpy(np.ones(64, np.float32), name="ones")
    w = sg_device.zeros((8, 8), name="w")
    x, out, y = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="out"), sg_device.zeros((8,), name="y")
    frozen = sg_device.full((8, 8), 1.0, name="frozen").freeze()
    with CudaGraph.scope(sg_stream, order="program") as s:
        s.record(slow_copy[1, 256](w.view((64,)).mut(), ones, 64, SPIN_NS))  # w = 1, late on a GPU
        s.record(library.fill_op(x.mut(), 2.0))
        mv = s.record(library.matvec_op(out.mut(), x, w))  # loads w before its wait
        after = s.record(library.add_op(y.mut(), out, out))
        weights = s.record(library.matvec_op(x.mut(), y, frozen))
    assert mv.deps == {1} and mv.programmatic == frozenset() and after.programmatic == {2}
    assert weights.programmatic == {3}
    with s.graph as g:
        for _ in range(3):
            sg_stream.run(sg.memset(w.mut(), 0.0))
            g.launch()
            g.sync()
            np.testing.assert_array_equal(out.numpy(), 16.0)


def test_pdl_false_records_full_edges_only(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    model = LayerStack(sg_device, Config(d=32, n_layers=2))
    for pdl, expect in ((True, True), (False, False)):
        with CudaGraph.scope(sg_stream, pdl=pdl) as s:
            for op in model.ops("fused"):
                s.record(op)
        with s.graph as g:
            assert any(n.programmatic for n in g.nodes) is expect
            if not pdl:
                assert g.programmatic_edges == []
    with pytest.raises(sg.SignatureError, match="pdl= takes True or False"):
        CudaGraph.scope(sg_stream, pdl=1)  # type: ignore[arg-type]


def test_the_host_backend_builds_no_programmatic_edges() -> None:
    dev = sg.device("host")
    x, y = dev.zeros((4,)), dev.zeros((4,))
    with CudaGraph.scope(dev.stream()) as s:
        s.record(library.fill_op(x.mut(), 1.0))
        node = s.record(library.add_op(y.mut(), x, x))
    assert node.programmatic == {0}  # recorded: it would be programmatic on an sm_90 GPU
    with s.graph as g:
        assert g.programmatic_edges == [] and "dashed" not in g.to_dot()


def test_the_host_backend_refuses_a_pdl_kernel_whose_source_never_waits() -> None:
    """A pdl=True kernel is a PdlWaitError when compiled for sm_90 if it never waits; the host
    backend compiles nothing, so it recorded such a kernel (with a programmatic edge) and ran it.
    It now refuses one whose text cannot wait: neither the instruction nor
    cudaGridDependencySynchronize anywhere in its source or options, and nothing included."""
    body = "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = 1.f;"
    never = f'extern "C" __global__ void k(float* out, int n) {{ {body} }}'

    def declare(source: str, **options: object) -> sg.Kernel[Any]:
        @sg.kernel(source, name="k", touches={"out": "n"}, pdl=True, options=options)
        def k(out: Mut[Tensor], n: sg.i32) -> None: ...

        @k.host
        def _k(out: NDArray, n: int) -> None:
            out[:n] = 1.0

        return k

    dev = sg.device("host")
    stream = dev.stream()
    x, out = dev.zeros((8,), name="x"), dev.zeros((8,), name="out")
    forgets = declare(never)
    with (
        pytest.raises(sg.PdlWaitError, match=r"never waits.*its source has neither") as refused,
        CudaGraph.scope(stream) as s,
    ):
        s.record(library.fill_op(x.mut(), 1.0))
        s.record(forgets[1, 32](out.mut(), 8))
    assert refused.value.kernel_name == "k" and "\nhelp: " in str(refused.value)
    with pytest.raises(sg.PdlWaitError):
        stream.run(forgets[1, 32](out.mut(), 8))
    triggers_only = declare(never.replace(body, 'asm volatile("griddepcontrol.launch_dependents;"); ' + body))
    commented_out = declare(
        "/*\n#include <cuda/pipeline>\n*/\n"
        + never.replace(body, "/* cudaGridDependencySynchronize(); */ // griddepcontrol.wait\n" + body)
    )
    for refused_kernel in (triggers_only, commented_out):
        with pytest.raises(sg.PdlWaitError):
            stream.run(refused_kernel[1, 32](out.mut(), 8))
    assert_stream_usable(stream)
    out.free()  # the refused scope pinned nothing
    out = dev.zeros((8,), name="out")
    wait = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
    for accepted in (
        declare(never.replace(body, wait + body)),
        declare(never.replace(body, "cudaGridDependencySynchronize(); " + body)),
        declare(never.replace(body, "WAIT; " + body), define_macro=("WAIT", wait)),
        declare(never.replace(body, 'asm volatile("griddepcontrol" ".wait;" ::: "memory"); ' + body)),
        declare(never.replace(body, "WAIT; " + body), define_macro=[("WAIT", wait)]),  # a list: no hashing
        declare("#include <pdl.h>\n" + never),  # the header may wait: the GPU's check decides
        sg.kernel(never, name="k", touches={"out": "n"})(forgets.__wrapped__),  # no pdl=True: no wait needed
    ):
        if accepted.host_fn is None:
            accepted.host(forgets.host_fn)  # type: ignore[arg-type]
        stream.run(accepted[1, 32](out.mut(), 8))
        assert out.numpy().tolist() == [1.0] * 8


# -- the declaration ---------------------------------------------------------------------------


def test_declaration_checks() -> None:
    src = 'extern "C" __global__ void k(float* out, const float* w, int n) {}'

    def declare(**kw: Any) -> None:
        @sg.kernel(src, name="k", **kw)
        def k(out: Mut[Tensor], w: Tensor, n: sg.i32) -> None: ...

    declare(pdl=True, reads_before_wait=("w",))
    declare(pdl=True, reads_before_wait="w")
    with pytest.raises(sg.SignatureError, match="not declared pdl=True"):
        declare(reads_before_wait=("w",))
    with pytest.raises(sg.SignatureError, match="Mut\\[Tensor\\] parameter"):
        declare(pdl=True, reads_before_wait=("out",))
    with pytest.raises(sg.SignatureError, match="not a tensor parameter"):
        declare(pdl=True, reads_before_wait=("n",))
    assert library.rms_norm.generics(64).pdl and library.rms_norm.generics(64).reads_before_wait == {"w"}
    assert not library.noop.pdl


def test_rebind_that_would_make_a_programmatic_edge_race_is_refused(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, out = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="out")
    m = sg_device.zeros((8, 8), name="m")
    w = sg_device.from_numpy(np.ones((8, 8), np.float32), name="w")
    with CudaGraph.scope(sg_stream) as s:
        s.record(fill2[1, 64](x.view((8,)).mut(), m.view((64,))[:8].mut(), 1.0, 8))  # writes x and m's first row
        s.record(library.matvec_op(out.mut(), x, w))  # programmatic after fill2: reads x after the wait
    with s.graph as g:
        with pytest.raises(sg.SignatureError, match="would load `m` before it waits"):
            g.rebind({w: m})
        g.launch()  # unchanged
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 8.0)


def test_rebind_onto_memory_a_programmatic_chain_may_still_write_is_refused(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """fill (node 0) writes m; the add reads it, so the matvec's only edge is the programmatic
    1 -> 2, and 0 -> 1 is programmatic too: the matvec may start once the add has started, which
    may be before the fill has written m. Rebinding the matvec's weights (loaded before its wait)
    to m would race, although node 0 is an ancestor of node 2."""
    x, out = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="out")
    m = sg_device.zeros((8, 8), name="m")
    w = sg_device.from_numpy(np.ones((8, 8), np.float32), name="w")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(m.mut(), 1.0))
        s.record(library.add_op(x.mut(), m.view((64,))[:8], m.view((64,))[:8]))  # x = 2, after node 0
        mv = s.record(library.matvec_op(out.mut(), x, w))
    assert mv.deps == {1} and mv.programmatic == {1}
    with s.graph as g:
        with pytest.raises(sg.SignatureError, match="every path from 0 ends in programmatic edges") as refused:
            g.rebind({w: m})
        assert "would load `m` before it waits, while node 0" in str(refused.value)
        assert "help:" in str(refused.value)
        g.launch()  # unchanged
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 16.0)


def test_rebind_onto_memory_a_full_edge_orders_is_accepted(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """The same shape with a memset and a memcpy (full edges) before the matvec: the matvec starts
    only after the memcpy has finished, which started only after the memset had finished."""
    k = 8
    m = sg_device.zeros((2, k), name="m")
    v = sg_device.from_numpy(np.ones((2, k), np.float32), name="v")
    src = sg_device.from_numpy(np.full((2, k), 2.0, np.float32), name="src")
    out = sg_device.zeros((2,), name="out")
    a, b = sg_device.zeros((4,), name="a"), sg_device.zeros((4,), name="b")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(m.mut(), 0.0))
        s.record(sg.memcpy(m.mut(), src))
        s.record(library.matvec_op(out.mut(), m[0], v))  # loads v before its wait
        s.record(library.add_op(a.mut(), b, b))  # a programmatic edge elsewhere in the graph
        s.record(library.add_op(b.mut(), a, a))
    with s.graph as g:
        assert any(n.programmatic for n in g.nodes)
        g.rebind({v: m})  # now it loads m early: ordered by the full edges 0 -> 1 -> 2
        g.launch()
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 2.0 * 2.0 * k)


# -- the library's PDL kernels, read as source (CI, no GPU) ------------------------------------


def _function_body(source: str, name: str) -> str:
    """The body of the __global__ function `name` (extern "C" or template) in `source`."""
    m = re.search(rf"__global__\s+void\s+(?:\w+\s+)*{re.escape(name)}\s*\(", source)  # attributes may come between
    assert m, f"no __global__ function `{name}` in the source"
    start = source.index("{", m.end())
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start + 1 : i]
    raise AssertionError(f"unbalanced braces in `{name}`")


def _top_level(body: str) -> str:
    """The statements at the body's own brace depth (nested blocks blanked)."""
    out, depth = [], 0
    for ch in body:
        if ch == "}":
            depth -= 1
        out.append(ch if depth == 0 else " ")
        if ch == "{":
            depth += 1
    return "".join(out)


def check_pdl_structure(k: sg.Kernel[Any], source: str) -> list[str]:
    """What is wrong with a PDL kernel's source: it must call pdl_wait() at its top level (every
    thread, unconditionally), return nowhere before it, and mention no tensor parameter before it
    except those named in reads_before_wait."""
    body = _function_body(source, k.cpp_name)
    top = _top_level(body)
    at = top.find("pdl_wait();")
    if at < 0:
        return [f"{k.cpp_name}: no unconditional pdl_wait() at the top level of its body"]
    before = body[:at]
    problems = [f"{k.cpp_name}: returns before pdl_wait()"] if re.search(r"\breturn\b", before) else []
    for p in k.params:
        if (
            p.kind != "scalar"
            and p.name not in k.reads_before_wait
            and re.search(rf"(?<![.\w]){p.name}\b", re.sub(r"//.*", "", before))
        ):
            problems.append(f"{k.cpp_name}: touches `{p.name}` before pdl_wait() (not in reads_before_wait)")
    return problems


PDL_KERNELS = [k for k in library.ALL_KERNELS if k.pdl]


@pytest.mark.parametrize("kernel", PDL_KERNELS, ids=lambda k: k.name_expression)
def test_library_pdl_kernels_wait_before_touching_their_inputs(kernel: sg.Kernel[Any]) -> None:
    assert check_pdl_structure(kernel, library.SOURCE) == []


def test_the_structure_check_catches_a_kernel_that_forgets_to_wait() -> None:
    assert check_pdl_structure(copy_waits, HELPERS) == []
    assert check_pdl_structure(copy_forgets, HELPERS) == [
        "copy_forgets: no unconditional pdl_wait() at the top level of its body"
    ]
    assert check_pdl_structure(copy_reads_early, HELPERS) == [
        "copy_reads_early: touches `src` before pdl_wait() (not in reads_before_wait)"
    ]
    early = library.SOURCE.replace(
        "pdl_launch_dependents();\n    pdl_wait();  // a and b", "float t = a[0];\n    pdl_wait();  // a and b"
    )
    assert check_pdl_structure(library.add, early) == ["add: touches `a` before pdl_wait() (not in reads_before_wait)"]
    nested = library.SOURCE.replace("pdl_wait();  // a and b are predecessors' outputs", "if (i < n) { pdl_wait(); }")
    assert check_pdl_structure(library.add, nested) == ["add: no unconditional pdl_wait() at the top level of its body"]


# -- the fused kernels against numpy (every backend) -------------------------------------------


def test_fused_matvec_kernels(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(7)
    for n, k in (
        (300, 1024),
        (70, 37),
        (5, 2048 + 4),
        (3, 13000),
        (40, 512),
        (9, 508),
    ):  # vector, scalar, vector with a tail, several passes, narrow rows, with a tail
        w_np, x_np, nw_np, o_np = rand(rng, n, k), rand(rng, k), rand(rng, k), rand(rng, n)
        w, x, nw = sg_device.from_numpy(w_np), sg_device.from_numpy(x_np), sg_device.from_numpy(nw_np)
        out, acc = sg_device.from_numpy(np.full(n, np.nan, np.float32)), sg_device.from_numpy(o_np)
        sg_stream.run(library.rms_norm_matvec_op(out.mut(), x, nw, w, 1e-5))
        sg_stream.run(library.matvec_add_op(acc.mut(), x, w))
        sg_stream.sync()
        x64 = x_np.astype(np.float64)
        norm = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * nw_np
        want = w_np.astype(np.float64) @ norm
        assert relative_error(out.numpy(), want) < 1e-5, (n, k)
        assert relative_error(acc.numpy(), o_np + w_np.astype(np.float64) @ x64) < 1e-5, (n, k)


# -- PDL on and off: identical results (every backend; the point is the GPU) -------------------


@pytest.mark.parametrize("form", list(FORMS))
def test_seed_model_identical_with_pdl_on_and_off(sg_device: sg.Device, sg_stream: sg.Stream, form: str) -> None:
    cfg = Config(d=256 if sg_device.is_cuda else 64, n_layers=6)
    x0 = np.random.default_rng(9).standard_normal(cfg.d).astype(np.float32)
    model = LayerStack(sg_device, cfg)
    start = sg_device.from_numpy(x0)
    results: dict[bool, NDArray] = {}
    for pdl in (True, False, True):
        sg_stream.run(sg.memcpy(model.hidden.mut(), start))
        with CudaGraph.scope(sg_stream, pdl=pdl) as s:
            for op in model.ops(form):
                s.record(op)
        with s.graph as g:
            for _ in range(3):
                g.launch()
            g.sync()
        got = model.hidden.numpy()
        if pdl in results:
            np.testing.assert_array_equal(got, results[pdl])  # deterministic
        results[pdl] = got
    np.testing.assert_array_equal(results[True], results[False])
    assert relative_error(results[True], reference_forward(model.host_weights, x0, cfg.eps, 3)) < 1e-4


def test_synthetic_chain_identical_with_pdl_on_and_off(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    chain = Chain(sg_device, 12, 1 << 18)
    got = {}
    for pdl in (True, False):
        with chain.record(sg_stream, pdl) as g:
            g.launch()
            g.sync()
        got[pdl] = chain.vectors[-1].numpy()
    np.testing.assert_array_equal(got[True], got[False])
    host = Chain(sg.device("host"), 12, 1 << 18)
    with host.record(sg.device("host").stream()) as g:
        g.launch()
    np.testing.assert_allclose(got[True], host.vectors[-1].numpy(), rtol=1e-4, atol=1e-2)


# -- the GPU: a kernel that forgets to wait is caught ------------------------------------------

SPIN_NS = 200_000


def _gpu_with_pdl() -> sg.Device:
    dev = sg.device("cuda")
    if not getattr(dev.backend, "pdl", False):
        pytest.skip("programmatic edges need an sm_90+ GPU")
    return dev


@pytest.mark.sg_cuda
def test_a_pdl_kernel_that_reads_before_its_wait_reads_stale_data() -> None:
    """The GPU catches what the source check (above) and the compile-time wait check cannot be
    relied on for: a kernel that waits, but reads its predecessor's output before the wait."""
    dev = _gpu_with_pdl()
    stream = dev.stream()
    ones = dev.from_numpy(np.ones(256, np.float32), name="ones")
    x, y = dev.zeros((256,), name="x"), dev.zeros((256,), name="y")
    results = {}
    for reader in (copy_waits, copy_reads_early):
        with CudaGraph.scope(stream) as s:
            s.record(sg.memset(x.mut(), 0.0))  # x is 0 until the slow writer's copy
            s.record(slow_copy[1, 256](x.mut(), ones, 256, SPIN_NS))
            s.record(reader[1, 256](y.mut(), x, 256))
        with s.graph as g:
            assert g.programmatic_edges == [(1, 2)]
            seen = []
            for _ in range(3):
                stream.run(sg.memset(y.mut(), -1.0))
                g.launch()
                g.sync()
                seen.append(y.numpy().copy())
        results[reader.cpp_name] = seen
    assert all(np.array_equal(r, np.ones(256)) for r in results["copy_waits"])
    # Reading before the wait, the reader ran during the writer's spin: it copied the zeros.
    assert any(not np.array_equal(r, np.ones(256)) for r in results["copy_reads_early"])


def _late(s: sg.Scope, dst: Tensor, value: Tensor) -> None:
    """dst is poisoned (NaN) in every replay, then gets `value` from a slow PDL writer."""
    s.record(sg.memset(dst.mut(), float("nan")))
    s.record(slow_copy[1, 256](dst.mut(), value, dst.size, SPIN_NS))


@pytest.mark.sg_cuda
@pytest.mark.parametrize("d", [256, 258])
def test_every_library_pdl_kernel_waits_for_a_slow_writer(d: int) -> None:
    """Each PDL kernel of the library runs right behind a predecessor that writes its inputs (all
    but the weights) only after spinning: a kernel that read them before its wait would see NaN.
    At d=258 the matvecs take their scalar loop (rows of k % 4 != 0)."""
    dev = _gpu_with_pdl()
    stream = dev.stream()
    rng = np.random.default_rng(11)
    n = 300
    host = sg.device("host")
    cases: list[tuple[str, Any, list[str]]] = [
        ("fill", lambda t: library.fill_op(t["out"].mut(), 3.0), ["out"]),
        ("add", lambda t: library.add_op(t["out"].mut(), t["a"], t["b"]), ["a", "b"]),
        ("axpy", lambda t: library.axpy_op(t["out"].mut(), t["a"], 2.0), ["out", "a"]),
        ("add_scalar", lambda t: library.add_scalar_op(t["out"].mut(), 0.5), ["out"]),
        ("rms_norm", lambda t: library.rms_norm_op(t["row"].mut(), t["x"].view((1, d)), t["nw"], 1e-5), ["x"]),
        ("matvec", lambda t: library.matvec_op(t["out"].mut(), t["x"], t["w"]), ["x"]),
        ("matvec_add", lambda t: library.matvec_add_op(t["out"].mut(), t["x"], t["w"]), ["out", "x"]),
        ("rms_norm_matvec", lambda t: library.rms_norm_matvec_op(t["out"].mut(), t["x"], t["nw"], t["w"], 1e-5), ["x"]),
    ]
    assert {c[0] for c in cases} == {k.cpp_name for k in PDL_KERNELS}
    values = {
        "out": rand(rng, n),
        "a": rand(rng, n),
        "b": rand(rng, n),
        "x": rand(rng, d),
        "nw": rand(rng, d),
        "w": rand(rng, n, d),
        "row": rand(rng, d),
    }
    for name, build, late in cases:
        want = {k: host.from_numpy(v) for k, v in values.items()}
        host.stream().run(build(want))
        t = {k: dev.from_numpy(v, name=k) for k, v in values.items()}
        sources = {k: dev.from_numpy(values[k]) for k in late}
        with CudaGraph.scope(stream) as s:
            for k in late:
                _late(s, t[k], sources[k])
            node = s.record(build(t))
        with s.graph as g:
            assert node.programmatic and all((d_, node.index) in g.programmatic_edges for d_ in node.programmatic), name
            for k in ("out", "row"):  # outputs start from their own values each replay
                g.update(sg.memcpy(t[k].mut(), dev.from_numpy(values[k])))
            g.launch()
            g.sync()
            for k in ("out", "row"):
                np.testing.assert_allclose(t[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def _model_graph(form: str) -> CudaGraph:
    """The seed model (d=128, 3 layers) in one of its forms, recorded on a PDL-capable GPU."""
    dev = _gpu_with_pdl()
    model = LayerStack(dev, Config(d=128, n_layers=3))
    with CudaGraph.scope(dev.stream()) as s:
        for op in model.ops(form):
            s.record(op)
    return s.graph


@pytest.mark.sg_cuda
def test_fused_model_graph_has_programmatic_edges_in_the_driver() -> None:
    with _model_graph("fused") as g:
        driver = g.executable.driver_edges()  # type: ignore[attr-defined]
        assert [(a, b) for a, b, _ in driver] == sorted(g.edges)
        assert [(a, b) for a, b, p in driver if p] == sorted(g.programmatic_edges) == sorted(g.edges)
        assert g.to_dot().count("style=dashed") == len(g.edges)


@pytest.mark.sg_cuda
@pytest.mark.parametrize("pdl", [True, False])
def test_programmatic_edges_in_a_loop_body_are_drawn_dashed(pdl: bool) -> None:
    """The DOT picture draws an edge dashed exactly when it is programmatic, inside loop bodies too
    (the CUDA backend builds a body's edges between PDL kernels as programmatic); a body's entry
    from its loop node is dotted, never dashed."""
    dev = _gpu_with_pdl()
    flag, x = dev.from_numpy(np.array([1], np.int32), name="flag"), dev.zeros((256,), name="x")
    with CudaGraph.scope(dev.stream(), pdl=pdl) as s, s.while_(flag, max_iterations=4) as body:
        body.record(library.add_scalar_op(x.mut(), 1.0))
        body.record(library.add_scalar_op(x.mut(), 2.0))
        body.record(library.count_down_op(flag.mut()))
    with s.graph as g:
        dot = g.to_dot()
        assert "n0 -> n0_body_0 [style=dotted];" in dot
        want = 'n0_body_0 -> n0_body_1 [label="x", style=dashed];' if pdl else 'n0_body_0 -> n0_body_1 [label="x"];'
        assert want in dot
        assert dot.count("dashed") == (1 if pdl else 0)  # count_down is no PDL kernel
        g.launch()
        g.sync()
        np.testing.assert_array_equal(x.numpy(), 3.0)


@pytest.mark.sg_cuda
def test_the_driver_graph_of_the_four_kernel_model_is_a_chain() -> None:
    """Its write-after-read edges skip back over the chain (x += b waits for the norm that read x);
    they are implied, so the executable graph leaves them out: a plain programmatic chain."""
    with _model_graph("kernels") as g:
        driver = g.executable.driver_edges()  # type: ignore[attr-defined]
        chain = [(i - 1, i, True) for i in range(1, len(g.nodes))]
        assert driver == chain
        assert len(g.edges) > len(driver) and {(a, b) for a, b, _ in driver} <= set(g.edges)


@pytest.mark.sg_cuda
def test_an_implied_edge_into_an_early_load_stays_in_the_driver_graph() -> None:
    """matvec loads w before its wait. w's writer is implied by the chain 0 -> 1 -> 2, but node 1
    triggers its dependents at entry, so without the direct (full) edge 0 -> 2 the matvec could
    load w while node 0 still spins before writing it."""
    dev = _gpu_with_pdl()
    stream = dev.stream()
    ones = dev.from_numpy(np.ones(64, np.float32), name="ones")
    w, x, out = dev.zeros((8, 8), name="w"), dev.zeros((8,), name="x"), dev.zeros((8,), name="out")
    with CudaGraph.scope(stream) as s:
        s.record(slow_copy[1, 256](w.view((64,)).mut(), ones, 64, SPIN_NS))  # w = 1, late
        s.record(slow_copy[1, 256](x.mut(), w.view((64,))[0:8], 8, 0))  # x = w[0]: after node 0
        mv = s.record(library.matvec_op(out.mut(), x, w))
    assert mv.deps == {0, 1} and mv.programmatic == {1}
    with s.graph as g:
        driver = g.executable.driver_edges()  # type: ignore[attr-defined]
        assert (0, 2, False) in driver and (1, 2, True) in driver
        for _ in range(3):
            stream.run(sg.memset(w.mut(), 0.0))
            g.launch()
            g.sync()
            np.testing.assert_array_equal(out.numpy(), 8.0)
