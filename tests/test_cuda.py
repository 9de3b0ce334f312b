"""What only the CUDA backend does: cuda.core graphs, driver errors, interop. Marked `cuda`."""

from __future__ import annotations

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library
from scopegraph._cli.seed_model import Config, LayerStack, relative_error

pytestmark = pytest.mark.sg_cuda


@pytest.fixture
def cuda() -> sg.Device:
    return sg.device("cuda")


def test_gpu_replay_equals_eager_gpu_and_host(cuda: sg.Device) -> None:
    cfg = Config(d=512, n_layers=4)
    x0 = np.random.default_rng(3).standard_normal(cfg.d).astype(np.float32)
    results = {}
    for name, dev, use_graph in (("graph", cuda, True), ("eager", cuda, False), ("host", sg.device("host"), True)):
        model = LayerStack(dev, cfg)
        stream = dev.stream()
        stream.run(sg.memcpy(model.hidden.mut(), dev.from_numpy(x0)))
        if use_graph:
            with model.record_graph(stream) as graph:
                for _ in range(3):
                    graph.launch()
                graph.sync()
                results[name] = model.hidden.numpy()
        else:
            ops = model.ops()
            for _ in range(3):
                model.run_eager(stream, ops)
            stream.sync()
            results[name] = model.hidden.numpy()
    assert relative_error(results["graph"], results["eager"]) < 1e-6
    assert relative_error(results["graph"], results["host"]) < 1e-5


def test_graph_is_a_cuda_core_graph_with_the_dataflow_edges(cuda: sg.Device) -> None:
    stream = cuda.stream()
    a, b, c = (cuda.zeros((64,), name=n) for n in "abc")
    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(a.mut(), 1.0))
        s.record(library.fill_op(b.mut(), 2.0))
        s.record(library.add_op(c.mut(), a, b))
        s.record(sg.memset(a.mut(), 0.0))
    with s.graph as graph:
        exe = graph.executable
        # Read from the driver with the edge data (cuda.core's edges() refuses graphs with programmatic edges).
        edges = exe.driver_edges()  # type: ignore[attr-defined]
        pdl = exe.pdl
        # fill and add are PDL kernels: programmatic on sm_90+; the memset's edge is a full one.
        assert edges == [(0, 2, pdl), (1, 2, pdl), (2, 3, False)]
        assert graph.edges == [(0, 2), (1, 2), (2, 3)]
        assert graph.programmatic_edges == ([(0, 2), (1, 2)] if pdl else [])
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(c.numpy(), 3.0)
        np.testing.assert_array_equal(a.numpy(), 0.0)
        dot = graph.to_dot(include_driver=True)
        assert "add(mut c, a, b)" in dot and dot.count("digraph") == 2


def test_template_instantiations_compile_once(cuda: sg.Device) -> None:
    k = library.rms_norm.generics(128)
    assert library.rms_norm.generics(128) is k and k.name_expression == "rms_norm<128>"
    x = cuda.from_numpy(np.ones((2, 64), np.float32))
    w = cuda.from_numpy(np.full(64, 2.0, np.float32))
    out = cuda.zeros((2, 64))
    stream = cuda.stream()
    for _ in range(2):
        stream.run(k[2, 128](out.mut(), x, w, 0.0, 64))
    stream.sync()
    assert len(k.compiled) == 1
    np.testing.assert_allclose(out.numpy(), 2.0, rtol=1e-6)


BOUNDED = 'extern "C" __global__ void __launch_bounds__(64) bounded(float* x) { x[threadIdx.x] = 1.0f; }'


@sg.kernel(BOUNDED)
def bounded(x: Mut[Tensor]) -> None: ...


def test_bad_launch_is_a_cuda_error_and_the_stream_survives(cuda: sg.Device) -> None:
    """A launch every GPU accepts in general but this kernel refuses (its __launch_bounds__): a
    LaunchResourceError, found before the driver is asked, and also a CudaError naming the launch
    and the driver's result; the stream stays usable, and a graph of it is never built."""
    stream = cuda.stream()
    x = cuda.zeros((128,), name="x")
    with pytest.raises(sg.CudaError) as info:
        stream.run(bounded[1, 128](x.mut()))
    assert type(info.value) is sg.LaunchResourceError and isinstance(info.value, sg.SignatureError)
    assert info.value.result == "CUDA_ERROR_INVALID_VALUE" and "bounded" in info.value.operation
    assert not info.value.context_lost and "at most 64" in str(info.value)
    with pytest.raises(sg.LaunchResourceError), CudaGraph.scope(stream) as s:
        s.record(bounded[1, 128](x.mut()))
    stream.run(library.fill_op(x.mut(), 1.0))
    stream.sync()
    np.testing.assert_array_equal(x.numpy(), 1.0)


REGISTER_HEAVY = r"""
extern "C" __global__ void register_heavy(float* out, const float* x) {
    float v[96];  // updated in place, so all 96 stay live: about 100 registers a thread
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = x[threadIdx.x + 1024 * i];
#pragma unroll
    for (int round = 0; round < 4; ++round)
#pragma unroll
        for (int i = 0; i < 96; ++i) v[i] = v[i] * v[(i + 1) % 96] + v[(i + 37) % 96];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += v[i];
    out[threadIdx.x] = s;
}
"""


@sg.kernel(REGISTER_HEAVY, touches={"out": "block_x", "x": "96 * 1024"})
def register_heavy(out: Mut[Tensor], x: Tensor) -> None: ...


def test_a_block_past_what_the_registers_allow_is_refused_before_the_driver(cuda: sg.Device) -> None:
    """No __launch_bounds__, but too many registers a thread for 1024 threads: refused when run,
    with the result the driver gives for it (out of resources) and the register count named."""
    out, x = cuda.zeros((1024,), name="out"), cuda.zeros((96 * 1024,), name="x")
    stream = cuda.stream()
    with pytest.raises(sg.LaunchResourceError) as info:
        stream.run(register_heavy[1, 1024](out.mut(), x))
    assert info.value.result == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert "registers a thread set that limit" in str(info.value) and "help: launch it with at most" in str(info.value)
    stream.run(register_heavy[1, 128](out[:128].mut(), x))  # a block it takes runs
    stream.sync()


REVERSE_THROUGH_SHARED = r"""
extern "C" __global__ void reverse_through_shared(float* out, const float* x, int n) {
    extern __shared__ float stage[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) stage[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = stage[n - 1 - i];
}
"""
WIDE = 100 * 1024  # bytes of dynamic shared memory: past the 48 KiB a kernel gets without opting in


@sg.kernel(REVERSE_THROUGH_SHARED, touches={"out": "n", "x": "n"}, max_shared_bytes=WIDE)
def reverse_through_shared(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None: ...


def test_a_kernel_that_opts_in_gets_more_than_48_kib_of_shared_memory(cuda: sg.Device) -> None:
    """max_shared_bytes: a launch with 100 KiB of dynamic shared memory runs eagerly and in a
    graph (the backend raised the kernel's limit; the driver refuses the launch otherwise)."""
    n = WIDE // 4
    x = cuda.from_numpy(np.arange(n, dtype=np.float32))
    eager, replayed = cuda.zeros((n,), name="eager"), cuda.zeros((n,), name="replayed")
    stream = cuda.stream()
    stream.run(reverse_through_shared[1, 1024, WIDE](eager.mut(), x, n))
    with CudaGraph.scope(stream) as s:
        s.record(reverse_through_shared[1, 1024, WIDE](replayed.mut(), x, n))
    with s.graph as graph:
        graph.launch()
        graph.sync()
    want = np.arange(n, dtype=np.float32)[::-1]
    np.testing.assert_array_equal(eager.numpy(), want)
    np.testing.assert_array_equal(replayed.numpy(), want)


def test_two_declarations_of_one_kernel_keep_their_own_shared_memory_limits(cuda: sg.Device) -> None:
    """Two declarations of the same code share one loaded kernel: the one that opts in to less must
    not lower what the other was given (the driver would then refuse the other's launch)."""
    big, small = (
        sg.kernel(REVERSE_THROUGH_SHARED, touches={"out": "n", "x": "n"}, max_shared_bytes=nbytes)(
            reverse_through_shared.__wrapped__
        )
        for nbytes in (150 * 1024, WIDE)
    )
    n = WIDE // 4
    x = cuda.from_numpy(np.arange(n, dtype=np.float32))
    out = cuda.zeros((n,), name="out")
    stream = cuda.stream()
    stream.run(big[1, 1024, 150 * 1024](out.mut(), x, n))
    stream.run(small[1, 1024, WIDE](out.mut(), x, n))  # loaded second, opting in to less
    stream.run(big[1, 1024, 150 * 1024](out.mut(), x, n))
    with CudaGraph.scope(stream) as s:
        s.record(big[1, 1024, 150 * 1024](out.mut(), x, n))
    with s.graph as graph:
        graph.launch()
        graph.sync()
    np.testing.assert_array_equal(out.numpy(), np.arange(n, dtype=np.float32)[::-1])


def test_mixing_devices_is_a_signature_error(cuda: sg.Device) -> None:
    host = sg.device("host")
    with pytest.raises(sg.SignatureError, match="mixes devices"):
        sg.memcpy(cuda.zeros((4,)).mut(), host.zeros((4,)))
    with pytest.raises(sg.SignatureError, match="but the stream is on cuda:0"):
        cuda.stream().run(sg.memset(host.zeros((4,)).mut(), 1.0))


def test_a_launch_without_tensors_runs_on_each_gpu_it_is_given() -> None:
    """Such a launch belongs to no device: one op, run and recorded on two GPUs, uses each GPU's
    own loaded kernel (compiled for that GPU, its limits checked against that GPU), and each GPU's
    work runs with its own context current, also when the thread switched GPUs in between."""
    from cuda.bindings import driver

    from scopegraph._driver import cuda_device_count

    if cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    noop = library.noop.rebuilt()  # loaded nowhere yet
    op = noop[1, 32]()
    assert op.device is None
    for index in (0, 1, 0):
        stream = sg.device(f"cuda:{index}").stream()
        stream.run(op)
        with CudaGraph.scope(stream) as s:
            s.record(op)
        with s.graph as graph:
            graph.launch()
            graph.sync()
        stream.sync()
        err, current = driver.cuCtxGetDevice()
        assert err == driver.CUresult.CUDA_SUCCESS and int(current) == index
    assert len(noop.compiled) == 2


def test_another_library_switching_gpus_on_the_thread_does_not_break_scopegraph() -> None:
    """torch.cuda.set_device(1) and a torch op between two pieces of scopegraph work on cuda:0, on
    one thread: scopegraph's allocations, copies, launches and graph builds still act on cuda:0."""
    from scopegraph._driver import cuda_device_count

    if cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    torch = pytest.importorskip("torch")
    gpu = sg.device("cuda:0")
    stream = gpu.stream()
    x = gpu.zeros((256,), name="x")
    stream.run(library.fill_op(x.mut(), 1.0))
    stream.sync()
    torch.cuda.set_device(1)
    try:
        assert float(torch.ones(4, device="cuda").sum()) == 4.0  # cuda:1's context is current now
        y = gpu.from_numpy(np.full(256, 2.0, np.float32), name="y")
        z = gpu.zeros((256,), name="z")
        stream.run(library.add_op(z.mut(), x, y))
        with CudaGraph.scope(stream) as s:
            s.record(library.add_op(x.mut(), z, y))
        with s.graph as graph:
            graph.launch()
            graph.sync()
        np.testing.assert_array_equal(x.numpy(), 5.0)
    finally:
        torch.cuda.set_device(0)


def test_torch_interop_without_copies(cuda: sg.Device) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(16, dtype=torch.float32, device="cuda")
    x = sg.Tensor.from_dlpack(t, name="t")
    assert x.shape == (16,) and x.allocation.borrowed and x.data_ptr == t.data_ptr()
    out = cuda.zeros((16,), name="out")
    torch_stream = torch.cuda.Stream()
    stream = sg.Stream.from_handle(torch_stream)
    with CudaGraph.scope(stream) as s:
        s.record(library.add_op(out.mut(), x, x))
    with s.graph as g:
        torch.cuda.synchronize()
        g.launch()
        g.sync()
    back = torch.from_dlpack(out)
    assert back.data_ptr() == out.data_ptr
    assert torch.equal(back, t * 2)
    assert torch.as_tensor(out, device="cuda").data_ptr() == out.data_ptr  # __cuda_array_interface__
    x.free()  # borrowed: scopegraph does not free torch's memory
    assert t.sum().item() == 120


def test_cupy_interop(cuda: sg.Device) -> None:
    cp = pytest.importorskip("cupy")
    a = cp.arange(8, dtype=cp.float32)
    x = sg.Tensor.from_dlpack(a)
    stream = cuda.stream()
    stream.run(library.add_scalar_op(x.mut(), 1.0))
    stream.sync()
    assert cp.asnumpy(a).tolist() == list(range(1, 9))
    assert cp.asarray(cuda.from_numpy(np.ones(3, np.float32))).sum().item() == 3.0
