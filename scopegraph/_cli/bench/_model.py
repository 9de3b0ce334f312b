"""Suite 2, the seed's model: tokens per second for n_layers = 1, 2, 4, 8, 22 at d=2048 (and 22
layers at d=512, where launches dominate), against PyTorch on the same math, and against the
ceiling: a read-only streaming kernel over as many bytes as the model's weights.

Like for like:

- Kernel counts per layer are stated: scopegraph's "fused" form runs 2 kernels a layer
  (RMSNorm fused into the first matvec, the residual add into the second); its "kernels" form
  runs the 4 that PyTorch runs (``torch.nn.functional.rms_norm``, two ``torch.mv``, ``add_``).
- scopegraph eager builds every op inside the clock, as PyTorch eager dispatches inside its own.
- ``torch.compile(mode="reduce-overhead")`` (fused kernels and CUDA graphs) is a column, for the
  22-layer rows (its compile time is too long for every row).
- Every side is timed the same way, interleaved (``_timing.interleaved``): best of 5 round
  medians, with the median and spread kept in the JSON (``timing``, and ``*_best``, ``*_median``,
  ``*_spread`` beside every rate). The ceiling's three bandwidths are interleaved with each other,
  over as many rounds as the rows.
"""

from __future__ import annotations

import functools
from typing import Any

from ... import CudaGraph, Device, Mut, Stream, Tensor, i64, kernel, library, memcpy
from ..seed_model import FORMS, Config, LayerStack
from ._table import markdown
from ._timing import Side, cell, figure, figures, interleaved, num, part, ratio

LAYERS = (1, 2, 4, 8, 22)
# A launch-bound size (weights fit in L2), where graph replay's advantage shows in full.
SMALL_D = 512
# scopegraph's fastest form of the model, and the one with PyTorch's kernel count.
FAST, EQUAL = "fused", "kernels"


@kernel(
    library.SOURCE
    + r"""
// Reads n4 float4 of src once, grid-stride, 8 loads in flight per thread; one sum per block.
extern "C" __global__ void read_only(float* __restrict__ out, const float4* __restrict__ src, long long n4) {
    float acc = 0.f;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
    for (; i + 7 * step < n4; i += 8 * step) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = __ldcs(src + i + u * step);
#pragma unroll
        for (int u = 0; u < 8; ++u) acc += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (; i < n4; i += step) { float4 v = __ldcs(src + i); acc += (v.x + v.y) + (v.z + v.w); }
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}
""",
    touches={"out": "grid_x", "src": "n4"},  # float4s, as the kernel declares `src`
)
def read_only(out: Mut[Tensor], src: Tensor, n4: i64) -> None:
    """One pass over src (n4 float4), read only: the ceiling of a weight-streaming model."""


@kernel(
    """extern "C" __global__ void copy4(float4* __restrict__ dst, const float4* __restrict__ src, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        dst[i] = __ldcs(src + i);
}""",
    touches={"dst": "n4", "src": "n4"},  # float4s
)
def copy4(dst: Mut[Tensor], src: Tensor, n4: i64) -> None:
    """dst = src, 16 bytes per thread per step: the bandwidth a plain copy kernel reaches."""


def bandwidth_timing(
    dev: Device, read_bytes: int, copy_bytes: int = 1 << 30, rounds: int = 5, inner: int = 3
) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """A read-only streaming kernel over ``read_bytes`` (the model's weights), and device-to-device
    copies (read + write) as a memcpy node and as a copy kernel, each a one-node graph, timed in
    interleaved rounds: the bytes each moves, and ``interleaved``'s seconds a replay."""
    sms = dev.backend.core.properties.multiprocessor_count  # type: ignore[attr-defined]
    src = dev.empty((read_bytes // 4,), name="stream_src")
    out = dev.zeros((sms * 8,), name="stream_out")
    a, b = dev.empty((copy_bytes // 4,), name="copy_a"), dev.empty((copy_bytes // 4,), name="copy_b")
    ops = {
        "read_only": read_only[sms * 8, 256](out.mut(), src, read_bytes // 16),
        "memcpy": memcpy(b.mut(), a),
        "copy_kernel": copy4[sms * 8, 256](b.mut(), a, copy_bytes // 16),
    }
    stream = dev.stream()
    graphs = {}
    for name, op in ops.items():
        with CudaGraph.scope(stream) as s:
            s.record(op)
        graphs[name] = s.graph
    timed = interleaved({name: (g.launch, stream.sync, 10) for name, g in graphs.items()}, rounds, inner)
    for g in graphs.values():
        g.close()
    for buf in (src, out, a, b):
        buf.free()
    return {"read_only": read_bytes, "memcpy": 2 * copy_bytes, "copy_kernel": 2 * copy_bytes}, timed


def bandwidths(dev: Device, read_bytes: int, copy_bytes: int = 1 << 30) -> dict[str, float]:
    """Bytes per second, best of ``bandwidth_timing``'s rounds: read_only, memcpy, copy_kernel."""
    nbytes, timed = bandwidth_timing(dev, read_bytes, copy_bytes)
    return {name: nbytes[name] / t["wall"] for name, t in timed.items()}


def record(model: LayerStack, form: str, pdl: bool = True) -> CudaGraph:
    stream = model.device.stream()
    with CudaGraph.scope(stream, pdl=pdl) as s:
        for op in model.ops(form):
            s.record(op)
    return s.graph


def run(dev: Device, quick: bool) -> dict[str, Any]:
    seed_d = 2048 if dev.is_cuda else 256
    tokens = 16 if quick else 64
    rounds, inner = (2, 1) if quick else (5, 3)
    rows = []
    sizes = [(seed_d, n) for n in (LAYERS if not quick else (1, 4))] + ([(SMALL_D, 22)] if dev.is_cuda else [])
    for d, n_layers in sizes:
        cfg = Config(d=d, n_layers=n_layers)
        model = LayerStack(dev, cfg)
        stream = dev.stream()
        eager = functools.partial(_eager, model, stream)
        fast, equal = record(model, FAST), record(model, EQUAL)
        sides: dict[str, Side] = {
            "sg_eager": (eager, stream.sync, max(2, tokens // 8)),
            "sg_graph": (fast.launch, fast.sync, tokens),
            "sg_graph_equal": (equal.launch, equal.sync, tokens),
        }
        if dev.is_cuda:
            sides |= _torch(model, tokens, compile=n_layers == 22 and not quick)
        timed = interleaved(sides, rounds=rounds, inner=inner)
        fast.close()
        equal.close()
        row: dict[str, Any] = {
            "d": d,
            "n_layers": n_layers,
            "kernels_per_layer": {"sg": FORMS[FAST][0], "sg_equal": FORMS[EQUAL][0], "torch": 4},
            "timing": timed,
            "weight_bytes": cfg.weight_bytes,
        }
        for key, t in timed.items():
            row |= figure(f"{key}_tok_s", part(t), rate=True)
        row["graph_over_eager"] = timed["sg_eager"]["wall"] / timed["sg_graph"]["wall"]
        row |= figure("graph_bandwidth", part(timed["sg_graph"]), scale=cfg.weight_bytes, rate=True)
        rows.append(row)
        for tensor in model.tensors():
            tensor.free()
    result: dict[str, Any] = {"d": seed_d, "rows": rows}
    if dev.is_cuda:
        # The ceiling, sampled as the rows are: best (the plain figures), median and spread.
        big = Config(d=seed_d, n_layers=max(LAYERS))
        nbytes, ceiling = bandwidth_timing(dev, big.weight_bytes, rounds=rounds, inner=inner)
        per = {name: figure("bandwidths", part(t), scale=nbytes[name], rate=True) for name, t in ceiling.items()}
        result |= figures("bandwidths", per) | {"ceiling_bytes": big.weight_bytes}
        for row in rows:
            row["fraction_of_read_only"] = row["graph_bandwidth"] / result["bandwidths"]["read_only"]
            scale = big.weight_bytes / row["weight_bytes"]  # tokens a pass over the ceiling's bytes
            row |= figure("read_only_tok_s", part(ceiling["read_only"]), scale=scale, rate=True)
    return result


def _eager(model: LayerStack, stream: Stream) -> None:
    for op in model.ops(FAST):  # built inside the clock
        stream.run(op)


def _torch(model: LayerStack, tokens: int, compile: bool) -> dict[str, Side]:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    cfg = model.cfg
    layers = [tuple(torch.from_numpy(a).cuda() for a in ws) for ws in model.host_weights]
    hidden = torch.zeros(cfg.d, device="cuda")
    shape = (cfg.d,)

    def forward() -> None:  # 4 kernels a layer: rms_norm, mv, mv, add_
        for norm_w, wq, wo in layers:
            hidden.add_(torch.mv(wo, torch.mv(wq, F.rms_norm(hidden, shape, norm_w, cfg.eps))))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward()
    sync = torch.cuda.synchronize
    sides: dict[str, Side] = {
        "torch_eager": (forward, sync, max(2, tokens // 8)),
        "torch_graph": (g.replay, sync, tokens),
    }
    if compile:

        def pure(h: Any) -> Any:
            for norm_w, wq, wo in layers:
                h = h + torch.mv(wo, torch.mv(wq, F.rms_norm(h, shape, norm_w, cfg.eps)))
            return h

        compiled = torch.compile(pure, mode="reduce-overhead")

        def step() -> None:
            torch.compiler.cudagraph_mark_step_begin()
            hidden.copy_(compiled(hidden))

        for _ in range(3):  # compile, record the CUDA graph, replay
            step()
        sides["torch_compile"] = (step, sync, tokens)
    return sides


def format_rows(m: dict[str, Any]) -> list[str]:
    heads = ["d", "layers", "sg eager", "sg graph", "graph/eager", "torch eager", "torch graph", "sg/torch graph"]
    heads += ["torch compile", "sg/compile", "sg 4k graph", "4k/torch graph", "GB/s", "of read-only"]
    rows = []
    for row in m["rows"]:
        sg, tg, tc = row["sg_graph_tok_s"], row.get("torch_graph_tok_s"), row.get("torch_compile_tok_s")
        eq = row.get("sg_graph_equal_tok_s")
        rows.append([
            str(row["d"]), str(row["n_layers"]), f"{row['sg_eager_tok_s']:.0f}", f"{sg:.0f}",
            f"{row['graph_over_eager']:.2f}", num(row.get("torch_eager_tok_s"), ".0f"), num(tg, ".0f"), ratio(sg, tg),
            num(tc, ".0f"), ratio(sg, tc), num(eq, ".0f"), ratio(eq, tg), f"{row['graph_bandwidth'] / 1e9:.0f}",
            num(row.get("fraction_of_read_only"), ".1%"),
        ])  # fmt: skip
    lines = [
        "## 2. the seed's model: tokens per second (best of 5 interleaved round medians; spread in bench.json)",
        f"kernels per layer: sg graph {FORMS[FAST][0]} ({FAST}: RMSNorm fused into the first matvec, residual add "
        f"into the second), sg 4k graph {FORMS[EQUAL][0]} (as PyTorch: rms_norm, mv, mv, add_), PyTorch 4; "
        f"sg eager runs the {FAST} form, ops built inside the clock",
        *markdown(heads, rows),
    ]
    if "bandwidths" in m:
        bw, nbytes = m["bandwidths"], m["ceiling_bytes"]
        gb_s = {name: cell(m, "bandwidths", ".0f", 1e-9, name) for name in bw}
        lines += [
            "",
            f"ceiling: a read-only streaming kernel over {nbytes / 1e6:.0f} MB (the 22-layer weights): "
            f"{gb_s['read_only']} GB/s = {cell(m, 'bandwidths', '.0f', 1 / nbytes, 'read_only')} tokens/s "
            f"at d={m['d']} x 22; device-to-device copy (read + write): memcpy {gb_s['memcpy']} GB/s, "
            f"copy kernel {gb_s['copy_kernel']} GB/s"
            + ("; best (median, spread) of interleaved rounds" if "bandwidths_median" in m else ""),
        ]
    return lines


def plot(m: dict[str, Any], out_dir: Any, plt: Any) -> None:
    """The suite's two pictures: where scopegraph stands at 22 layers, and its speedups against
    the number of layers."""
    _plot_standing(m, out_dir, plt)
    _plot_speedup(m, out_dir, plt)


def _plot_speedup(m: dict[str, Any], out_dir: Any, plt: Any) -> None:
    """``model_speedup.png``: at the seed's width, scopegraph's graph against its own eager run and
    against PyTorch's CUDA graph (where measured), for each number of layers."""
    rows = [row for row in m["rows"] if row["d"] == m["d"]]
    if not rows:
        return
    layers = [row["n_layers"] for row in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(layers, [row["graph_over_eager"] for row in rows], marker="o", label="scopegraph graph / its eager run")
    for key, label in (
        ("sg_graph_tok_s", f"scopegraph graph ({FORMS[FAST][0]}k/layer) / PyTorch CUDA graph"),
        ("sg_graph_equal_tok_s", f"scopegraph graph ({FORMS[EQUAL][0]}k/layer) / PyTorch CUDA graph"),
    ):
        if all("torch_graph_tok_s" in row for row in rows):
            ax.plot(layers, [row[key] / row["torch_graph_tok_s"] for row in rows], marker="s", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xscale="log", xlabel="layers", ylabel="speedup (tokens/s ratio)", title=f"seed model, d={m['d']}")
    ax.set_xticks(layers, [str(n) for n in layers])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "model_speedup.png", dpi=120)


def _plot_standing(m: dict[str, Any], out_dir: Any, plt: Any) -> None:
    """``where_scopegraph_stands.png``: tokens per second of the 22-layer model at each width, every
    side of the comparison, with the read-only ceiling as a line."""
    rows = [row for row in m["rows"] if row["n_layers"] == max(LAYERS)]
    if not rows:
        return
    sides = [
        ("sg_graph_tok_s", f"scopegraph graph ({FAST}, {FORMS[FAST][0]}k/layer, PDL)"),
        ("sg_graph_equal_tok_s", f"scopegraph graph ({FORMS[EQUAL][0]}k/layer, PDL)"),
        ("sg_eager_tok_s", "scopegraph eager"),
        ("torch_compile_tok_s", 'torch.compile("reduce-overhead")'),
        ("torch_graph_tok_s", "PyTorch CUDA graph (4k/layer)"),
        ("torch_eager_tok_s", "PyTorch eager"),
    ]
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        shown = [(label, row[key]) for key, label in sides if key in row]
        ax.barh([label for label, _ in shown][::-1], [v for _, v in shown][::-1], color="tab:blue")
        if "read_only_tok_s" in row and row["d"] == m["d"]:
            ax.axvline(row["read_only_tok_s"], color="tab:red", linestyle="--", label="read-only streaming ceiling")
            ax.legend(loc="lower right", fontsize=8)
        ax.set(xlabel="tokens per second", title=f"seed model d={row['d']} x {row['n_layers']} layers")
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "where_scopegraph_stands.png", dpi=120)
