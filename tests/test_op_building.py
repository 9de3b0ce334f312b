"""Issue 11, cheaper ops: building an op takes fast paths (cached launchers, generated argument
binders, cached scalars and fill patterns, a plain-case borrow check). Each test warms the fast
path first, then checks that what the general path refuses is still refused with its own error,
and that what it accepts binds to the same values."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import Mut, Tensor, library
from scopegraph._errors import BorrowError, LifetimeError, SignatureError
from scopegraph._kernel import declared_pointee_bytes, declared_template

from .helpers import device_memory


def _bits(value: object) -> bytes:
    assert isinstance(value, np.generic)
    return value.tobytes()


def test_launch_shapes_are_cached_but_still_checked(sg_device: sg.Device) -> None:
    add = library.add
    assert add[2, 128] is add[2, 128]  # checked once per distinct shape
    assert add[(2, 1), (128,)].grid == (2, 1, 1)
    for bad in [(True, 128), (2.0, 128), (2, 128.0), ((2, True), 128), (0, 128), (2, 2048), [2, 128]]:
        with pytest.raises(SignatureError):
            add[bad]  # type: ignore[index]
    np_grid = add[np.int64(2), 128]  # type: ignore[index]
    assert np_grid.grid == (2, 1, 1) and type(np_grid.grid[0]) is int


RAW_FILL = """
extern "C" __global__ void raw_fill(float* out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
extern "C" __global__ void byte_fill(unsigned char* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1;
}
"""


@sg.kernel(RAW_FILL, touches={"out": "n"})
def raw_fill(out: Mut[Tensor], value: sg.f32, n: sg.i32) -> None: ...


@raw_fill.host
def _raw_fill(out: Any, value: np.float32, n: np.int32) -> None:
    out.view(np.float32)[:n] = value


@sg.kernel(RAW_FILL, touches={"out": "n"})
def byte_fill(out: Mut[Tensor], n: sg.i32) -> None: ...


@byte_fill.host
def _byte_fill(out: Any, n: np.int32) -> None:
    out.view(np.uint8)[:n] = 1


def test_touches_of_a_parameter_without_dtype_count_the_kernels_elements(sg_device: sg.Device) -> None:
    """`out` declares no dtype, so it takes what its C++ pointer points to, or raw bytes (an sg.u8
    tensor); the kernel writes `float`s (its C declaration says so), and n of them must fit the
    tensor's bytes, not n of its elements."""
    raw = sg_device.zeros((32,), sg.u8, name="raw")
    refused = r"would touch 16 4-byte elements of `out` \(64 bytes\), but `raw\[0:16\]` has 16 bytes"
    with pytest.raises(SignatureError, match=refused):
        raw_fill[1, 16](raw[0:16].mut(), 1.0, 16)
    stream = sg_device.stream()
    stream.run(raw_fill[1, 16](raw.mut(), 1.0, 8))  # 8 floats: 32 bytes, all of `raw`
    np.testing.assert_array_equal(raw.numpy().view(np.float32), 1.0)
    floats = sg_device.zeros((16,), name="floats")
    stream.run(byte_fill[1, 64](floats.mut(), 64))  # 64 bytes of 16 floats
    with pytest.raises(SignatureError, match="would touch 65 1-byte elements"):
        byte_fill[1, 96](floats.mut(), 65)
    # A build from another source counts what that source declares.
    doubles = raw_fill.rebuilt(source=RAW_FILL.replace("float* out", "double* out"))
    doubles[1, 16](raw.mut(), 1.0, 4)  # 4 doubles: 32 bytes, all of `raw`
    with pytest.raises(SignatureError, match="would touch 5 8-byte elements"):
        doubles[1, 16](raw.mut(), 1.0, 5)


def test_opting_in_to_more_shared_memory_is_kept_by_every_build_of_a_kernel() -> None:
    """max_shared_bytes raises what a launch may ask for (48 KiB otherwise), for the kernel, its
    template instantiations and its rebuilds alike."""
    src = "template <int B> __global__ void staged(float* out) { extern __shared__ float s[]; out[0] = s[B]; }"

    def staged(out: sg.Mut[sg.Tensor]) -> None: ...

    wide = sg.kernel(src, max_shared_bytes=96 * 1024)(staged)
    plain = sg.kernel(src)(staged)
    assert wide.max_shared_bytes == 96 * 1024  # launched through its instantiations (a template)
    for k in (wide.generics(4), wide.rebuilt(options=(("use_fast_math", True),)).generics(4)):
        assert k.max_shared_bytes == 96 * 1024
        assert k[1, 32, 96 * 1024].shmem == 96 * 1024
        with pytest.raises(SignatureError, match="max_shared_bytes"):
            k[1, 32, 96 * 1024 + 4]
    assert plain.max_shared_bytes == 48 * 1024
    with pytest.raises(SignatureError, match=r"opt in to more with @sg.kernel\(\.\.\., max_shared_bytes=N\)"):
        plain.generics(4)[1, 32, 48 * 1024 + 4]
    for bad in (0, -1, True, np.True_, 1.5, 227 * 1024 + 1):
        with pytest.raises(SignatureError, match="max_shared_bytes"):
            sg.kernel(src, max_shared_bytes=bad)(staged)  # type: ignore[arg-type]
    assert sg.kernel(src, max_shared_bytes=np.int64(65536))(staged).max_shared_bytes == 65536  # type: ignore[arg-type]
    narrow = sg.kernel(src, max_shared_bytes=1024)(staged).generics(4)  # less than 48 KiB is a limit too
    assert narrow[1, 32, 1024].shmem == 1024
    with pytest.raises(SignatureError, match=r"at most the 1024 bytes its declaration allows"):
        narrow[1, 32, 4096]


def test_generated_binder_keeps_every_argument_check(sg_device: sg.Device) -> None:
    out, x = sg_device.zeros((256,), name="out"), sg_device.zeros((256,), name="x")
    library.axpy_op(out.mut(), x, 2.0)  # warm: binder made, scalars cached
    assert "def bind(op, a0, a1, a2, a3)" in (library.axpy._binder.__doc__ or "")
    with pytest.raises(SignatureError, match="needs a mutable borrow"):
        library.axpy[1, 256](out, x, 2.0, 256)  # type: ignore[arg-type]
    with pytest.raises(SignatureError, match="only reads `x`"):
        library.axpy[1, 256](out.mut(), x.mut(), 2.0, 256)  # type: ignore[arg-type]
    with pytest.raises(SignatureError, match=r"expects sg\.i32"):
        library.axpy[1, 256](out.mut(), x, 2.0, 256.0)  # type: ignore[arg-type]
    with pytest.raises(SignatureError, match="cannot hold exactly"):
        library.axpy[1, 256](out.mut(), x, 2.0, 2**31)
    with pytest.raises(SignatureError, match="cannot hold exactly"):
        library.axpy[1, 256](out.mut(), x, 1e39, 256)  # overflows f32
    with pytest.raises(SignatureError, match="would touch 257 elements"):
        library.axpy[1, 256](out.mut(), x, 2.0, 257)
    with pytest.raises(SignatureError, match="dtype"):
        library.axpy[1, 256](out.mut(), sg_device.zeros((256,), sg.f64), 2.0, 256)
    # Keyword arguments take the general path and bind the same values.
    a = library.axpy[1, 256](out.mut(), x, 2.0, 256)
    b = library.axpy[1, 256](out=out.mut(), x=x, a=2.0, n=256)
    assert [_bits(v) for v in a.args[2:]] == [_bits(v) for v in b.args[2:]]
    assert a.args[2].dtype == np.float32 and a.args[3].dtype == np.int32


def test_scalar_cache_keeps_the_sign_of_zero(sg_device: sg.Device) -> None:
    out = sg_device.zeros((4,))
    for value in (0.0, -0.0, 0.0, -0.0):
        op = library.fill[1, 4](out.mut(), value, 4)
        assert _bits(op.args[1]) == _bits(np.float32(value))
    assert library.fill[1, 4](out.mut(), 0.1, 4).args[1] == np.float32(0.1)
    assert library.fill[1, 4](out.mut(), 1, 4).args[1] == np.float32(1.0)  # an int for a float: general path


def test_fast_borrow_check_still_refuses(sg_device: sg.Device) -> None:
    a, b, c = (sg_device.zeros((256,), name=n) for n in "abc")
    library.add_op(c.mut(), a, b)  # warm
    library.add_op(c.mut(), a, a)  # two shared borrows of one tensor: fine
    with pytest.raises(BorrowError, match="also borrowed as mutable"):
        library.add_op(c.mut(), c, b)  # type: ignore[scopegraph-borrow]
    with pytest.raises(BorrowError, match="also borrowed as mutable"):
        library.add[1, 128](c[:128].mut(), a, c[64:192], 128)  # overlapping views
    library.add[1, 128](c[:128].mut(), a, c[128:], 128)  # disjoint views of one allocation
    with pytest.raises(BorrowError, match="frozen"):
        library.add_op(a.freeze().mut(), b, c)
    library.add_op(c.mut(), a, b)  # a frozen tensor may still be read
    b.free()
    with pytest.raises(LifetimeError, match="freed"):
        library.add_op(c.mut(), a, b)


def test_memset_and_memcpy_fast_paths_still_refuse(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, y = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="y")
    assert sg.memset(x.mut(), 0.0).pattern == np.float32(0.0).tobytes()
    assert sg.memset(x.mut(), -0.0).pattern == np.float32(-0.0).tobytes()  # not the cached +0.0
    assert sg.memset(x.mut(), 2.0).pattern is sg.memset(x.mut(), 2.0).pattern  # cached
    with pytest.raises(SignatureError, match="cannot hold exactly"):
        sg.memset(x.mut(), 1e39)
    with pytest.raises(SignatureError, match="sizes differ"):
        sg.memcpy(x.mut(), sg_device.zeros((4,)))
    with pytest.raises(BorrowError, match="also borrowed as mutable"):
        sg.memcpy(x[:4].mut(), x[2:6])
    sg.memcpy(x[:4].mut(), x[4:])
    y.freeze()
    with pytest.raises(BorrowError, match="frozen"):
        sg.memset(y.mut(), 2.0)
    with pytest.raises(BorrowError, match="frozen"):
        sg.memcpy(y.mut(), x)
    x.free()
    with pytest.raises(LifetimeError, match="freed"):
        sg.memset(x.mut(), 2.0)
    with pytest.raises(LifetimeError, match="freed"):
        sg.memcpy(sg_device.zeros((8,)).mut(), x)


@pytest.mark.parametrize(
    ("dtype", "value"),
    [(sg.uint8, 7), (sg.float16, -1.5), (sg.int16, -2), (sg.float32, 3.25), (sg.int32, -5), (sg.float64, 0.0)],
)
def test_eager_memset_and_memcpy_write_every_width(
    sg_device: sg.Device, sg_stream: sg.Stream, dtype: sg.DType, value: float
) -> None:
    """Eager fills of 1-, 2- and 4-byte patterns (the CUDA backend picks cuMemsetD8/D16/D32) and
    copies between views at offsets write exactly their bytes."""
    x = sg_device.full((6,), 1, dtype)
    sg_stream.run(sg.memset(x[1:5].mut(), value))
    expect = np.array([1, value, value, value, value, 1], dtype.numpy)
    np.testing.assert_array_equal(x.numpy(), expect)
    y = sg_device.zeros((6,), dtype)
    sg_stream.run(sg.memcpy(y[2:6].mut(), x[:4]))
    np.testing.assert_array_equal(y.numpy(), np.concatenate([np.zeros(2, dtype.numpy), expect[:4]]))


def test_eager_memcpy_and_memset_allocate_nothing_per_call(
    sg_device: sg.Device, sg_stream: sg.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: an eager copy or fill takes no memory of its own (no staging buffer, no pattern
    tensor): 200 of each call the backend's allocator not once."""
    x, y = sg_device.zeros((64,), name="x"), sg_device.zeros((64,), name="y")
    sg_stream.run(sg.memset(x.mut(), 1.0))  # whatever a first call sets up once is not per call
    sg_stream.run(sg.memcpy(y.mut(), x))
    allocated: list[int] = []
    real = sg_device.backend.allocate

    def counting(nbytes: int) -> tuple[object, int]:
        allocated.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(sg_device.backend, "allocate", counting)
    sg_stream.sync()
    pool = device_memory(sg_device)  # on CUDA also the memory pool, whoever would allocate from it
    for i in range(200):
        sg_stream.run(sg.memset(x[i % 64 :].mut(), float(i)))
        sg_stream.run(sg.memcpy(y.mut(), x))
    sg_stream.sync()
    assert allocated == [] and device_memory(sg_device).get("pool_used") == pool.get("pool_used")
    expect = np.array([float(max(i for i in range(200) if i % 64 <= j)) for j in range(64)], np.float32)
    np.testing.assert_array_equal(y.numpy(), expect)
    sg_device.zeros((4,))  # the count works: a real allocation is seen
    assert len(allocated) == 1


# -- declarations the op builder would misread, refused when the kernel is declared ----------------


def test_a_parameter_default_is_refused_when_the_kernel_is_declared() -> None:
    """mypy would accept a launch that leaves a defaulted argument out, and building the op would
    then refuse it: a CUDA kernel takes every argument, so the default is refused up front."""

    def k(o: sg.Mut[sg.Tensor], n: sg.i32 = 8) -> None: ...

    with pytest.raises(SignatureError, match=r"parameter `n` has a default \(8\)") as info:
        sg.kernel('extern "C" __global__ void k(float* o, int n) {}')(k)
    assert "help: drop the default and pass `n` at launch" in str(info.value)
    assert "sg.Param" in str(info.value)


def declared_with(annotation: str) -> Any:
    """A function ``out_param(o: <annotation>)``, for sg.kernel to read."""
    namespace: dict[str, Any] = {}
    exec(
        "from typing import Annotated\nimport scopegraph as sg\nfrom scopegraph import Mut, Tensor\n"
        f"def out_param(o: {annotation}) -> None: ...",
        namespace,
    )
    return namespace["out_param"]


@pytest.mark.parametrize(
    "annotation",
    ["Mut[int]", "Mut[sg.f32]", "Mut[Mut[Tensor]]", "Mut", "Mut[Annotated[Tensor, sg.TensorSpec(sg.f32)]]"],
)
def test_a_mut_of_anything_but_tensor_is_refused_when_the_kernel_is_declared(annotation: str) -> None:
    """Only ``Mut[Tensor]`` declares a written tensor; the rest was read as one, its meaning dropped."""
    with pytest.raises(SignatureError, match=r"kernel `out_param` parameter `o` is annotated") as info:
        sg.kernel("")(declared_with(annotation))
    assert "help: annotate `o` as Mut[Tensor]" in str(info.value)


def test_mut_tensor_with_a_spec_outside_is_still_a_written_parameter() -> None:
    param = sg.kernel("")(declared_with("Annotated[Mut[Tensor], sg.TensorSpec(sg.f32)]")).params[0]
    assert param.kind == "mut" and param.dtype == sg.float32


def test_a_template_kernel_launched_without_generics_is_refused_on_every_backend(sg_device: sg.Device) -> None:
    """No GPU can compile ``rms_norm`` without its template argument, so the host backend, which
    would run the reference, refuses the launch too, before an op is built; its instantiations launch."""
    x = sg_device.from_numpy(np.ones((1, 256), np.float32))
    w = sg_device.from_numpy(np.ones(256, np.float32))
    y = sg_device.zeros((1, 256))
    with pytest.raises(SignatureError, match=r"`rms_norm` is a C\+\+ template kernel \(template <int BS>\)") as info:
        library.rms_norm[1, 256](y.mut(), x, w, 1e-5, 256)
    assert "help: instantiate it first, one value per template parameter: rms_norm.generics(...)" in str(info.value)
    sg_device.stream().run(library.rms_norm.generics(256)[1, 256](y.mut(), x, w, 1e-5, 256))
    np.testing.assert_allclose(y.numpy(), 1.0, rtol=1e-5)


def test_generics_takes_as_many_arguments_as_the_template_declares() -> None:
    """The host backend ran an instantiation with too few or too many template arguments (NVRTC
    refuses it only on a GPU); and a numpy float value was read as its dtype (tk<32, float>)."""

    @sg.kernel("template <int BS, typename T = float> __global__ void tk(T* out) { out[threadIdx.x] = BS; }")
    def tk(out: Mut[Tensor]) -> None: ...

    assert tk.generics(32).template_args == ("32",)
    assert tk.generics(32) is tk.generics(32) is tk.generics("32")  # one instantiation, however named
    assert tk.generics(np.int64(32), sg.f64).template_args == ("32", "double")
    # An instantiation looked up by the arguments as given does not answer for equal-hashing ones.
    assert tk.generics(1).template_args == ("1",) and tk.generics(True).template_args == ("true",)
    with pytest.raises(SignatureError, match="is neither an integer nor a type"):
        tk.generics(1.0)
    for args, got in (((), 0), ((1, sg.f32, 3), 3)):
        with pytest.raises(SignatureError, match=rf"template <int BS, typename T = float>: 1 to 2 .*got {got}"):
            tk.generics(*args)
    for value in (np.float32(2.0), 2.5):
        with pytest.raises(SignatureError, match="is neither an integer nor a type"):
            tk.generics(32, value)
    # What C++ reads as comparisons (in parentheses) and overloads of other arities are no miscount.
    for source, given in (
        ("template <int A = (3 > 2), int B = (8 >> 1)> __global__ void tc(float* out) {}", (1, 2)),
        (
            "template <typename T, typename std::enable_if<(sizeof(T) > 2), int>::type = 0>"
            " __global__ void tc(T* out) {}",
            ("float",),
        ),
        (
            "template <int A> __global__ void tc(float* out) {}\n"
            "template <int A, int B> __global__ void tc(float* out, int n) {}",
            (1, 2),
        ),
    ):
        assert sg.kernel(source, name="tc")(tk.__wrapped__).generics(*given).template_args == tuple(map(str, given))
    # A template whose parameter list holds braces is still one (the scan misses its `template <`).
    braced = "template <int N = int{2}> __global__ void tb(float* out) { out[0] = N; }"
    assert sg.kernel(braced, name="tb")(tk.__wrapped__).generics(3).template_args == ("3",)
    # C linkage is certain, in an extern "C" block too, whatever templates the source also holds.
    block = "template <class T> __device__ T twice(T x) { return x + x; }\n"
    block += 'extern "C" {\n__global__ void tb(float* out) {}\n}'
    with pytest.raises(SignatureError, match="is not a C\\+\\+ template kernel"):
        sg.kernel(block, name="tb")(tk.__wrapped__).generics(3)
    # A kernel that is no template at all (NVRTC refuses `add<3>`; the host ran it).
    with pytest.raises(SignatureError, match=r"`add` is not a C\+\+ template kernel.*\n.*\nhelp: launch it as it is"):
        library.add.generics(3)


def test_a_host_reference_sees_the_template_arguments_and_reaches_every_derived_kernel() -> None:
    """The host ran one reference for every instantiation (the GPU gives 3 for tv<3>, the host gave
    what the reference assumed); and a kernel rebuilt() before @k.host had no reference on the host."""

    @sg.kernel("template <int V> __global__ void tv(float* out, int n) { if (threadIdx.x < n) out[threadIdx.x] = V; }")
    def tv(out: Mut[Tensor], n: sg.i32) -> None: ...

    fast = tv.rebuilt(options=(("use_fast_math", True),))  # made before the reference is registered

    @tv.host
    def _(out: Any, n: Any, *, template_args: tuple[str, ...]) -> None:
        out[:n] = int(template_args[0])

    dev = sg.device("host")
    stream, y = dev.stream(), dev.zeros((4,), name="y")
    for kernel, value in ((tv.generics(2), 2.0), (tv.generics(3), 3.0), (fast.generics(5), 5.0)):
        stream.run(kernel[1, 4](y.mut(), 4))
        np.testing.assert_array_equal(y.numpy(), value)
    own = tv.rebuilt(options=(("use_fast_math", False),))
    own.host(lambda out, n, *, template_args: out.fill(-1.0))  # its own reference ...
    tv.host(lambda out, n, *, template_args: out.fill(7.0))  # ... stays when the base's changes
    for kernel, value in ((own.generics(1), -1.0), (tv.generics(1), 7.0), (fast.generics(1), 7.0)):
        stream.run(kernel[1, 4](y.mut(), 4))
        np.testing.assert_array_equal(y.numpy(), value)


def test_launch_shapes_a_kernel_does_not_expect_are_refused_when_the_op_is_built() -> None:
    """The library's raw kernels assume their shapes: on a GPU a matvec in blocks of 16 threads
    sums its rows with lanes that do not exist, and past 2**28 blocks its rows wrap around to
    negative ones; rms_norm<256> in blocks of 128 left half of each row unwritten, and a 2-D launch
    of an elementwise kernel repeated its += (the host reference computed the intended result)."""
    dev = sg.device("host")
    x, w, y = dev.zeros((64,), name="x"), dev.zeros((64, 64), name="w"), dev.zeros((64,), name="y")
    row, normed, gain = dev.zeros((1, 256), name="row"), dev.zeros((1, 256), name="normed"), dev.zeros((256,))
    flag = dev.zeros((1,), sg.i32, name="flag")
    refused: list[tuple[Any, str]] = [
        (
            lambda: library.matvec[1, 16](y.mut(), x, w, 64, 64),
            r"\[\(1, 1, 1\), \(16, 1, 1\)\]: a block is whole warps",
        ),
        (lambda: library.matvec_add[1, 300](y.mut(), x, w, 64, 64), "32 to 512 of them, not 300"),
        (lambda: library.matvec[2**28 + 1, 32](y.mut(), x, w, 64, 64), "at most 268435456 blocks"),
        (lambda: library.rms_norm.generics(256)[1, 128](normed.mut(), row, gain, 1e-5, 256), "exactly 256 threads"),
        (lambda: library.axpy[(1, 2), 32](y.mut(), x, 1.0, 64), "must be one-dimensional"),
        (lambda: library.count_down[1, (1, 2)](flag.mut()), "must be one-dimensional"),
    ]
    for build, message in refused:
        with pytest.raises(SignatureError, match=message) as info:
            build()
        assert "help: launch it with a shape its check accepts" in str(info.value)
    library.matvec[2, 64](y.mut(), x, w, 64, 64)  # whole warps: fine
    library.matvec[2**28, 32](y.mut(), x, w, 64, 64)  # as many blocks as an int's rows
    library.rms_norm.generics(256)[1, 256](normed.mut(), row, gain, 1e-5, 256)

    def at_most_one_block(grid: Any, block: Any, template_args: tuple[str, ...]) -> str | None:
        return None if grid == (1, 1, 1) else "it synchronises through shared memory: one block"

    @sg.kernel('extern "C" __global__ void one(float* out) {}', launch_check=at_most_one_block)
    def one(out: Mut[Tensor]) -> None: ...

    one[1, 32](y.mut())
    with pytest.raises(SignatureError, match=r"`one` cannot run as \[\(2, 1, 1\), .*: .*one block"):
        one[2, 32](y.mut())
    with pytest.raises(SignatureError, match="launch_check=3"):
        sg.kernel("", launch_check=3)  # type: ignore[arg-type]
    for answer in ("", False, 0):  # neither None nor a reason: refused, not taken for "it runs"

        def answering(grid: Any, block: Any, template_args: tuple[str, ...], given: Any = answer) -> Any:
            return given

        @sg.kernel('extern "C" __global__ void vague(float* out) {}', launch_check=answering)
        def vague(out: Mut[Tensor]) -> None: ...

        with pytest.raises(SignatureError, match=rf"launch_check of `vague` returned {answer!r}") as info:
            vague[1, 32](y.mut())
        assert "help: return None for a shape the kernel runs" in str(info.value)


def test_a_parameter_with_two_tensor_specs_is_refused() -> None:
    """The second TensorSpec (here i32, rank 2) was silently dropped."""
    with pytest.raises(SignatureError, match="parameter `x` has 2 TensorSpecs") as info:

        @sg.kernel('extern "C" __global__ void k(float* out, const float* x) {}')
        def k(out: Mut[Tensor], x: Annotated[Tensor, sg.TensorSpec(sg.f32), sg.TensorSpec(sg.i32, rank=2)]) -> None: ...

    assert "help: give one TensorSpec with every constraint" in str(info.value)


def test_a_scalar_annotated_with_a_dtype_object_names_its_alias() -> None:
    """sg.float32 (a dtype) where sg.f32 (the alias mypy reads as float) belongs: the message said
    "has annotation sg.f32 ... annotate it with one of those (sg.f32, ...)"."""
    with pytest.raises(SignatureError, match=r"annotated with a dtype object \(float32\)") as info:

        @sg.kernel('extern "C" __global__ void k(float* out, float a) {}')
        def k(out: Mut[Tensor], a: sg.float32) -> None: ...  # type: ignore[valid-type]

    assert "help: annotate `a` with sg.f32" in str(info.value)


TEMPLATES = r"""
#include "not_read.h"
/* was: __global__ void scaled(float* out); */
extern "C" __global__ void plain(float* out) { printf("__global__ void scaled(float* out)"); }
__device__ void scaled(int* flag);
template <typename T, int N = (3 > 2)> __global__ void __launch_bounds__(256) scaled(T* out);
template <typename T, int N = (3 > 2)> __global__ void __launch_bounds__(256) scaled(T* out) { plain(0); }
__device__ void helper(float* out) { scaled<float, 1><<<1, 1>>>(out); }
"""


@pytest.mark.parametrize(
    ("name", "parameters"),
    [("plain", None), ("scaled", "<typename T, int N = (3 > 2)>"), ("helper", None), ("from_a_header", None)],
)
def test_templates_are_found_in_the_declaration_only(name: str, parameters: str | None) -> None:
    """Comments, strings, calls and device functions are not declarations of a kernel; a kernel the
    source does not spell out (a header, a macro) is left to the compiler."""
    assert declared_template(TEMPLATES, name) == parameters


ECHO = r"""
extern "C" __global__ void echo(long long* ints, unsigned long long* big, double* real,
                                signed char a, short b, unsigned char c, unsigned int d, long long e,
                                unsigned long long f, double g) {
    ints[0] = a; ints[1] = b; ints[2] = c; ints[3] = d; ints[4] = e;
    big[0] = f; real[0] = g;
}
"""


@sg.kernel(ECHO)
def echo(
    ints: Mut[Tensor],
    big: Mut[Tensor],
    real: Mut[Tensor],
    a: sg.i8,
    b: sg.i16,
    c: sg.u8,
    d: sg.u32,
    e: sg.i64,
    f: sg.u64,
    g: sg.f64,
) -> None: ...


@echo.host
def _echo(ints: Any, big: Any, real: Any, *scalars: Any) -> None:
    a, b, c, d, e, f, g = scalars
    ints[:] = [a, b, c, d, e]
    big[0], real[0] = f, g


def test_every_scalar_type_reaches_the_kernel_as_its_c_type(sg_device: sg.Device) -> None:
    """Each scalar is passed as its declared C type (cuda.core reads a plain int as a pointer), at
    the edges of its range: what the kernel writes back is exactly what was passed."""
    ints, big = sg_device.zeros((5,), sg.i64, name="ints"), sg_device.zeros((1,), sg.u64, name="big")
    real = sg_device.zeros((1,), sg.f64, name="real")
    stream = sg_device.stream()
    stream.run(
        echo[1, 1](ints.mut(), big.mut(), real.mut(), -128, -(2**15), 255, 2**32 - 1, -(2**40), 2**63 + 5, 1 / 3)
    )
    assert ints.numpy().tolist() == [-128, -(2**15), 255, 2**32 - 1, -(2**40)]
    assert int(big.numpy()[0]) == 2**63 + 5 and float(real.numpy()[0]) == 1 / 3


def test_the_bench_kernels_count_their_own_float4_elements(sg_device: sg.Device) -> None:
    """The bandwidth kernels take float4 pointers: a launch over a tensor's whole bytes builds (its
    counts are float4s), and one float4 past the end is refused."""
    from scopegraph._cli.bench._model import copy4, read_only

    src, dst, out = (sg_device.zeros((1024,), name=n) for n in ("src", "dst", "out"))
    read_only[8, 256](out.mut(), src, 256)
    copy4[8, 256](dst.mut(), src, 256)
    with pytest.raises(SignatureError, match="would touch 257 16-byte elements"):
        copy4[8, 256](dst.mut(), src, 257)


WIDE = r"""
typedef float real;
using index = unsigned long;
struct Pair { float a, b; };
extern "C" __global__ void wide(uint4* a, float3* b, long* c, long int* d, size_t* e, real* f, index* g,
                                double3* h, ulonglong2* i, signed char* j, void* k, int n) {}
extern "C" __global__ void pairs(struct Pair* out, int n) {}
extern "C" __global__ void wide_a(uint4* a, int n) {}
"""


def test_the_bytes_each_c_type_points_to() -> None:
    """Integer types in every spelling (LP64, as nvcc lays them out on Linux: `long` is 8 bytes),
    CUDA vector types, size_t and aliases of these; None for void* and a scalar; the spelling of a
    type no rule sizes (a struct)."""
    assert declared_pointee_bytes(WIDE, "wide") == (16, 12, 8, 8, 8, 4, 8, 24, 16, 1, None, None)
    assert declared_pointee_bytes(WIDE, "pairs") == ("struct Pair", None)


@sg.kernel(WIDE, touches={"a": "n"})
def wide_a(a: Mut[Tensor], n: sg.i32) -> None: ...


def test_touches_counts_a_vector_pointee_in_its_own_bytes() -> None:
    """The GPU audit: a uint4* parameter was counted in the tensor's 4-byte floats, so a launch
    that writes 16 bytes an element past its view was accepted (and overwrote the next view)."""
    out = sg.device("host").zeros((64,), name="out")  # 256 bytes: 16 uint4
    wide_a[1, 1](out.mut(), 16)
    with pytest.raises(SignatureError, match="would touch 17 16-byte elements"):
        wide_a[1, 1](out.mut(), 17)


def test_touches_refuses_a_pointee_it_cannot_size_unless_the_parameter_has_a_dtype() -> None:
    @sg.kernel(WIDE, touches={"out": "n"})
    def pairs(out: Mut[Tensor], n: sg.i32) -> None: ...

    out = sg.device("host").zeros((16,), name="out")
    with pytest.raises(SignatureError, match=r"`out`, which points to `struct Pair`, a type scopegraph cannot size"):
        pairs[1, 1](out.mut(), 8)

    @sg.kernel(WIDE, name="pairs", touches={"out": "n"})
    def pairs_of_f32(out: Annotated[Mut[Tensor], sg.TensorSpec(sg.f32)], n: sg.i32) -> None: ...

    pairs_of_f32[1, 1](out.mut(), 16)  # counted in f32s, as declared
    with pytest.raises(SignatureError, match="would touch 17 elements"):
        pairs_of_f32[1, 1](out.mut(), 17)


AXPY_C = r"""
extern "C" __global__ void axpy_c(float* out, const float* x, float a, int n);
extern "C" __global__ void axpy_c(float* out, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += a * x[i];
}
extern "C" __global__ void arrays(float out[], const float x[], unsigned n) {}
extern "C" __global__ void nothing(void) {}
#define DECLARE(name) extern "C" __global__ void name(float* out)
DECLARE(hidden) {}
"""


def _axpy_c(declare: Any) -> Any:
    """``declare`` (a function) as the kernel axpy_c of AXPY_C, with a host reference."""
    k = sg.kernel(AXPY_C, name="axpy_c")(declare)
    k.host(lambda *args: None)
    return k


def _two(out: Mut[Tensor], x: Tensor) -> None: ...
def _swapped(x: Mut[Tensor], out: Tensor, a: sg.f32, n: sg.i32) -> None: ...
def _const_written(out: Tensor, y: Mut[Tensor], a: sg.f32, n: sg.i32) -> None: ...
def _tensor_for_int(out: Mut[Tensor], x: Tensor, a: sg.f32, n: Tensor) -> None: ...
def _scalar_for_pointer(out: Mut[Tensor], x: sg.f32, a: sg.f32, n: sg.i32) -> None: ...
def _wide_int(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i64) -> None: ...
def _float_for_int(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.f32) -> None: ...
def _int_for_float(out: Mut[Tensor], x: Tensor, a: sg.i32, n: sg.i32) -> None: ...


@pytest.mark.parametrize(
    ("declare", "args", "message"),
    [
        (_two, 2, r"`axpy_c` is declared with 2 parameters in Python and 4 in its C\+\+ source"),
        (_swapped, 4, r"names its parameters in another order in Python than in C\+\+"),
        (_const_written, 4, r"parameter 2, `y`, is a Mut\[Tensor\], and the C\+\+ parameter points to const data"),
        (_tensor_for_int, 4, r"parameter 4, `n`, is a Tensor, and the C\+\+ parameter is `int`"),
        (_scalar_for_pointer, 4, r"parameter 2, `x`, is a scalar \(x: sg.f32\), and the C\+\+ parameter is a pointer"),
        (_wide_int, 4, r"parameter 4, `n`, is sg.i64 \(8 bytes\), and the C\+\+ parameter is `int`"),
        (_float_for_int, 4, r"parameter 4, `n`, is sg.f32 \(4 bytes\), and the C\+\+ parameter is `int`"),
        (_int_for_float, 4, r"parameter 3, `a`, is sg.i32 \(4 bytes\), and the C\+\+ parameter is `float`"),
    ],
)
def test_a_python_declaration_that_disagrees_with_the_cpp_one_is_refused_on_every_backend(
    sg_device: sg.Device, sg_stream: sg.Stream, declare: Any, args: int, message: str
) -> None:
    """On a GPU such a launch would pass a wrong parameter buffer (a swapped pair also turns the
    tracker's borrows around); the host backend would run it regardless. Refused when the op is
    built, on every backend, and the stream stays usable."""
    k = _axpy_c(declare)
    out, x = sg_device.zeros((8,), name="out"), sg_device.zeros((8,), name="x")
    given: list[Any] = [out.mut(), x, 1.0, 8][:args]
    if declare in (_swapped, _const_written):
        given = [x.mut(), out, 1.0, 8] if declare is _swapped else [out, x.mut(), 1.0, 8]
    if declare is _tensor_for_int:
        given[3] = sg_device.zeros((1,), name="n")
    if declare is _scalar_for_pointer:
        given[1] = 1.0
    if declare is _int_for_float:
        given[2] = 1
    with pytest.raises(SignatureError, match=message) as caught:
        k[1, 8](*given)
    assert "help:" in str(
        caught.value
    ) and "C++:    __global__ void axpy_c(float* out, const float* x, float a, int n)" in str(caught.value)
    sg_stream.run(library.fill_op(out.mut(), 2.0))
    assert out.numpy().tolist() == [2.0] * 8


def test_declarations_that_agree_with_the_cpp_one_build() -> None:
    """A forward declaration without names, array parameters, an unsigned C++ int for sg.i32 and
    `(void)` agree; a declaration behind a macro is the compiler's business (not read)."""
    dev = sg.device("host")
    out, x = dev.zeros((8,), name="out"), dev.zeros((8,), name="x")

    @sg.kernel(AXPY_C, name="axpy_c")
    def axpy_declared(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i32) -> None: ...

    @sg.kernel(AXPY_C)
    def arrays(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None: ...

    @sg.kernel(AXPY_C)
    def nothing() -> None: ...

    @sg.kernel(AXPY_C)
    def hidden(out: Mut[Tensor], x: Tensor) -> None: ...  # two parameters where the macro has one

    for built in (
        axpy_declared[1, 8](out.mut(), x, 1.0, 8),
        arrays[1, 8](out.mut(), x, 8),
        nothing[1, 1](),
        hidden[1, 1](out.mut(), x),
    ):
        assert isinstance(built, sg.KernelLaunch)
    # A kernel may leave a pointer it only reads without const: declared Tensor, it builds.
    assert isinstance(library.matvec[1, 32](out.mut(), x, dev.zeros((8, 8), name="w"), 8, 8), sg.KernelLaunch)


AGREEING = r"""
typedef float real;
using wide_real = double;
typedef float* floats;
#define IN const float*
#define HAS_BIAS 0
extern "C" __global__ void aliased(float* out, real a, wide_real b) {}
extern "C" __global__ void flagged(float* out, bool flag) {}
extern "C" __global__ void through_typedef(floats out, IN x) {}
extern "C" __global__ void optional_bias(float* out,
#if HAS_BIAS
                                         const float* bias,
#endif
                                         int n) {}
extern "C" __global__ void brain(float* out, __nv_bfloat16 a) {}
"""


def _aliased(out: Mut[Tensor], a: sg.f32, b: sg.f64) -> None: ...
def _flagged(out: Mut[Tensor], flag: sg.u8) -> None: ...
def _through_typedef(out: Mut[Tensor], x: Tensor) -> None: ...
def _optional_bias(out: Mut[Tensor], n: sg.i32) -> None: ...
def _brain(out: Mut[Tensor], a: sg.i16) -> None: ...


@pytest.mark.parametrize(
    ("declare", "scalars"),
    [(_aliased, [1.0, 2.0]), (_flagged, [1]), (_through_typedef, None), (_optional_bias, [8]), (_brain, [0x3F80])],
)
def test_declarations_the_preprocessor_or_a_typedef_shapes_build(declare: Any, scalars: list[Any] | None) -> None:
    """A typedef of a float type is a float, a C++ bool takes a 1-byte integer, a bfloat16 its
    bits as an sg.i16, and a pointer behind a typedef or a macro, or a parameter list an `#if`
    shapes, is the compiler's business: none is refused (each was, in a first version of the check)."""
    dev = sg.device("host")
    k = sg.kernel(AGREEING, name=declare.__name__[1:])(declare)
    k.host(lambda *args: None)
    out, x = dev.zeros((8,), name="out"), dev.zeros((8,), name="x")
    args = [out.mut(), *(scalars if scalars is not None else [x])]
    assert isinstance(k[1, 1](*args), sg.KernelLaunch)


def test_a_bfloat16_is_not_an_f16() -> None:
    """Both are 2 bytes; the kernel would read an f16's bits as a bfloat16 (another value)."""

    @sg.kernel(AGREEING)
    def brain(out: Mut[Tensor], a: sg.f16) -> None: ...

    with pytest.raises(
        SignatureError, match=r"`a`, is sg.f16 \(2 bytes\), and the C\+\+ parameter is `__nv_bfloat16`"
    ) as info:
        brain[1, 1](sg.device("host").zeros((8,), name="out").mut(), 1.0)
    assert "help: declare `a` as sg.i16 (the value's bits" in str(info.value)


def test_a_forward_declaration_spelled_otherwise_keeps_the_touches_count() -> None:
    """`unsigned int` in the forward declaration, `unsigned` in the definition: read as two
    declarations that differ, the uint4 pointee went unsized and a 64-element launch over a
    64-float tensor (1024 bytes of uint4 against 256) was accepted."""
    source = (
        'extern "C" __global__ void wide4(uint4*, unsigned int);\n'
        'extern "C" __global__ void wide4(uint4* a, unsigned n) {}'
    )

    @sg.kernel(source, touches={"a": "n"})
    def wide4(a: Mut[Tensor], n: sg.u32) -> None: ...

    out = sg.device("host").zeros((64,), name="out")
    wide4[1, 1](out.mut(), 16)
    with pytest.raises(SignatureError, match="would touch 64 16-byte elements"):
        wide4[1, 1](out.mut(), 64)


def test_a_launchs_own_mistake_is_reported_before_the_declarations() -> None:
    """The first launch of a kernel whose declaration disagrees with its C++ one, and which also
    borrows wrongly: the borrow (the caller's line) is the error; the next launch, the declaration;
    and the declaration again after that (nothing is kept from a launch that failed)."""
    dev = sg.device("host")
    k = _axpy_c(_wide_int)
    out, x = dev.zeros((8,), name="out"), dev.zeros((8,), name="x")
    with pytest.raises(BorrowError):
        k[1, 8](out.mut(), out, 1.0, 8)
    for _ in range(2):
        with pytest.raises(SignatureError, match=r"`n`, is sg.i64 \(8 bytes\)"):
            k[1, 8](out.mut(), x, 1.0, 8)


def test_names_come_from_whichever_declaration_spells_them() -> None:
    """An unnamed forward declaration first, the named definition after it: the definition's
    names still catch two parameters given in another order."""
    source = (
        'extern "C" __global__ void pair(float*, const float*);\n'
        'extern "C" __global__ void pair(float* out, const float* x) {}'
    )

    @sg.kernel(source)
    def pair(x: Mut[Tensor], out: Tensor) -> None: ...

    pair.host(lambda *args: None)
    dev = sg.device("host")
    with pytest.raises(SignatureError, match="names its parameters in another order") as info:
        pair[1, 1](dev.zeros((4,), name="a").mut(), dev.zeros((4,), name="b"))
    assert "C++:    __global__ void pair(float* out, const float* x)" in str(info.value)


TYPED = r"""
extern "C" __global__ void typed(float* out, const double* x, const int* index, const uint4* raw, void* any,
                                 int n) {}
"""


def _typed(out: Mut[Tensor], x: Tensor, index: Tensor, raw: Tensor, any: Tensor, n: sg.i32) -> None: ...


def test_a_tensor_of_another_dtype_than_its_cpp_pointer_is_refused_on_every_backend(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """`float* out` given an f64 tensor: on a GPU the kernel would read and write its bytes as
    floats, while the host reference computes on the f64 values, so a host test passes and the GPU
    result is garbage. A tensor of no declared dtype takes what its pointer points to (an int* an
    sg.i32 or sg.u32 one), or sg.u8 bytes; void* and integer vectors (uint4*) take any dtype."""
    k = sg.kernel(TYPED, name="typed")(_typed)
    k.host(lambda *args: None)
    z = sg_device.zeros

    def launch(**changed: Tensor) -> sg.KernelLaunch:
        given = {"out": z((8,), name="out"), "x": z((8,), sg.f64, name="x"), "index": z((8,), sg.i32, name="i")}
        given |= {"raw": z((8,), sg.f16, name="r"), "any": z((8,), sg.i64, name="a")}
        given |= changed
        return k[1, 8](given["out"].mut(), given["x"], given["index"], given["raw"], given["any"], 8)

    sg_stream.run(launch())
    sg_stream.run(launch(index=z((8,), sg.u32, name="u"), raw=z((8,), name="f"), any=z((8,), sg.u8, name="b")))
    sg_stream.run(launch(out=z((32,), sg.u8, name="bytes")))  # raw bytes go to any pointer
    for changed, refused in (
        (
            {"out": z((8,), sg.f64, name="wide")},
            r"`out` got `wide` of dtype f64, and the C\+\+ parameter is `float\* ou",
        ),
        ({"x": z((8,), name="narrow")}, r"`x` got `narrow` of dtype f32, .* is `const double\* x`"),
        ({"index": z((8,), sg.i64, name="long")}, r"`index` got `long` of dtype i64"),
    ):
        with pytest.raises(SignatureError, match=refused) as info:
            launch(**changed)
        takes = {"out": "sg.f32", "x": "sg.f64", "index": "sg.i32 or sg.u32"}[next(iter(changed))]
        assert f"help: pass a tensor of {takes}, or make the C++ parameter point to" in str(info.value)
    out = z((8,), name="out")
    sg_stream.run(library.fill_op(out.mut(), 2.0))  # the stream is still usable
    assert out.numpy().tolist() == [2.0] * 8


def test_a_declared_dtype_its_cpp_pointer_does_not_take_is_refused() -> None:
    """A TensorSpec that contradicts the C++ pointer is the declaration's mistake: refused on the
    first launch, whatever tensor it gets."""

    @sg.kernel(TYPED, name="typed")
    def typed_wrongly(
        out: Annotated[Mut[Tensor], sg.TensorSpec(sg.f64)],
        x: Tensor,
        index: Tensor,
        raw: Tensor,
        any: Tensor,
        n: sg.i32,
    ) -> None: ...

    typed_wrongly.host(lambda *args: None)
    dev = sg.device("host")
    out, x, index, raw, any = (dev.zeros((8,), d) for d in (sg.f64, sg.f64, sg.i32, sg.f32, sg.f32))
    with pytest.raises(
        SignatureError, match=r"parameter 1, `out`, is declared sg.f64, and the C\+\+ parameter is `float\* out`"
    ) as info:
        typed_wrongly[1, 8](out.mut(), x, index, raw, any, 8)
    assert "help: declare it sg.f32, or make the C++ parameter point to double (sg.f64)" in str(info.value)


ALIASED_POINTEES = r"""
typedef float2 cplx;
using real = float;
typedef real real_too;
typedef __half2 h2;
typedef int index_t;
extern "C" __global__ void pointees(cplx* c, real_too* r, h2* h, bool* flags, float4* v, index_t* i, float* ranked,
                                    __nv_bfloat162* pairs, cplx z) {}
"""


def test_pointee_types_behind_aliases_vectors_and_bools() -> None:
    """An alias counts as the type it names (a typedef of float2 was read as an 8-byte integer and
    refused f32 data); vector types take any dtype (float4 is a 16-byte copy type as often as four
    floats); a bool* takes 1-byte elements; a parameter that declares only its rank still gets its
    dtype checked, and one that declares sg.u8 (bytes) goes to any pointer."""

    @sg.kernel(ALIASED_POINTEES)
    def pointees(
        c: Mut[Tensor],
        r: Tensor,
        h: Tensor,
        flags: Tensor,
        v: Tensor,
        i: Tensor,
        ranked: Annotated[Tensor, sg.TensorSpec(rank=1)],
        pairs: Tensor,
        z: sg.f64,  # a float2 by value: 8 bytes, not an 8-byte integer
    ) -> None: ...

    pointees.host(lambda *args: None)
    dev = sg.device("host")
    z = dev.zeros

    def launch(**changed: Tensor) -> sg.KernelLaunch:
        given = {"c": z((8,), name="c"), "r": z((8,), name="r"), "h": z((8,), sg.f16, name="h")}
        given |= {"flags": z((8,), bool, name="f"), "v": z((8,), sg.f16, name="v"), "i": z((8,), sg.i32, name="i")}
        given |= {"ranked": z((8,), name="ranked"), "pairs": z((8,), sg.i16, name="p")} | changed
        return pointees[1, 1](
            given["c"].mut(),
            given["r"],
            given["h"],
            given["flags"],
            given["v"],
            given["i"],
            given["ranked"],
            given["pairs"],
            0.0,
        )

    launch()
    launch(flags=z((8,), sg.u8, name="u8"), v=z((8,), sg.i64, name="longs"), i=z((8,), sg.u32, name="u"))
    launch(c=z((8,), sg.f64, name="doubles"))  # a float2 (a vector type) takes any dtype
    for changed, refused in (
        (
            {"r": z((8,), sg.i32, name="ints")},
            r"`r` got `ints` of dtype i32, and the C\+\+ parameter is `real_too\* r`",
        ),
        ({"h": z((8,), name="floats")}, r"`h` got `floats` of dtype f32"),
        ({"flags": z((8,), name="wide")}, r"`flags` got `wide` of dtype f32"),
        ({"i": z((8,), name="float_index")}, r"`i` got `float_index` of dtype f32"),
        ({"ranked": z((8,), sg.f64, name="wide_ranked")}, r"`ranked` got `wide_ranked` of dtype f64"),
        ({"pairs": z((8,), name="fp")}, r"`pairs` got `fp` of dtype f32, .* is `__nv_bfloat162\* pairs`"),
    ):
        with pytest.raises(SignatureError, match=refused):
            launch(**changed)

    @sg.kernel('extern "C" __global__ void bytes_out(float* out) {}')
    def bytes_out(out: Annotated[Mut[Tensor], sg.TensorSpec(sg.u8)]) -> None: ...

    bytes_out.host(lambda *args: None)
    bytes_out[1, 1](z((64,), sg.u8).mut())


def test_a_kernel_its_source_never_names_is_refused_on_every_backend(sg_device: sg.Device) -> None:
    """A misnamed kernel ran its host reference on the host backend; a GPU finds nothing to load.
    A source that may define it out of sight (an include, token pasting, a macro option) and an
    empty one (a host-only declaration) are not judged."""

    def axpy_typo(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i32) -> None: ...

    out, x = sg_device.zeros((8,), name="out"), sg_device.zeros((8,), name="x")
    with pytest.raises(SignatureError, match="kernel `axpy_typo` is not in its source") as info:
        sg.kernel(AXPY_C)(axpy_typo)[1, 8](out.mut(), x, 1.0, 8)
    assert "the source defines `arrays`, `axpy_c`, `nothing`" in str(info.value) and "help: name the C++" in str(
        info.value
    )
    bounded = "__global__ void __launch_bounds__(256) real_name(float* out, const float* x, float a, int n) {}"
    with pytest.raises(SignatureError, match="the source defines `real_name`"):
        sg.kernel(bounded)(axpy_typo)[1, 8](out.mut(), x, 1.0, 8)
    for source, options in (
        ("#include <cuda_fp16.h>\n" + AXPY_C, None),
        ("#define K(n) n##_typo\n" + AXPY_C, None),
        ("#define KNAME axpy_typo\n" + AXPY_C.replace("void axpy_c(", "void KNAME("), None),
        (AXPY_C, {"define_macro": ("axpy_typo", "axpy_c")}),
        (AXPY_C, {"pre_include": "kernels.cuh"}),
        ("", None),
    ):
        k = sg.kernel(source, options=options)(axpy_typo)
        k.host(lambda *args: None)
        assert isinstance(k[1, 8](out.mut(), x, 1.0, 8), sg.KernelLaunch)


def test_generics_takes_arguments_of_the_kinds_the_template_declares() -> None:
    """A dtype for `int B` and an int for `typename T` were instantiated on the host (NVRTC refuses
    both on a GPU), and C++ text that is no single argument was pasted into the instantiation."""

    @sg.kernel("template <int B, typename T = float> __global__ void tk(T* out) {}")
    def tk(out: Mut[Tensor]) -> None: ...

    assert tk.generics(32, sg.f64).template_args == ("32", "double")
    assert tk.generics("2 * 16", "float").template_args == ("2 * 16", "float")
    constrained = sg.kernel("template <std::integral T, int B> __global__ void tk(T* out) {}", name="tk")
    assert constrained(tk.__wrapped__).generics(sg.i32, 4).template_args == ("int", "4")
    for args, refused in (
        ((sg.f32,), r"template parameter 1, `int B`, takes a value, and generics\(\) got 'float'"),
        (("32, 64",), "is not one C"),
        (("64 >> 1",), "is not one C"),
        ((32, 8), r"template parameter 2, `typename T = float`, takes a type, and generics\(\) got '8'"),
        (("1>(); int evil<2",), r"template argument '1>\(\); int evil<2' of `tk` is not one C\+\+ template argument"),
        (("(3",), "is not one C"),
    ):
        with pytest.raises(SignatureError, match=refused) as info:
            tk.generics(*args)
        assert "help:" in str(info.value)
