"""Tuning the PDL library kernels on a GPU (issue 11): variants of the seed model's fused kernels
(trigger before or after the wait, bulk L2 prefetch of the weights or not, rows per warp, loads in
flight), each with programmatic edges on and off, against the read-only streaming ceiling.

    PYTHONPATH=. python3 scripts/tune_pdl.py

The variants are the library's own source compiled with macros (SG_LATE_TRIGGER, SG_L2_PREFETCH,
CHUNK) and launched with other grids; benchmarks/NOTES.md records what was chosen and why.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._cli.bench._chain import Chain
from scopegraph._cli.bench._model import bandwidths
from scopegraph._cli.bench._timing import interleaved
from scopegraph._cli.seed_model import Config, LayerStack, reference_forward, relative_error
from scopegraph._kernel import Kernel


def variant(k: Kernel[Any], macros: tuple[str, ...]) -> Kernel[Any]:
    if not macros:
        return k
    pairs = [tuple(m.split("=", 1)) for m in macros]  # cuda.core: (name, value), or a list of them
    return Kernel(
        k.__wrapped__,
        k.source,
        k.cpp_name,
        (("define_macro", pairs[0] if len(pairs) == 1 else pairs),),
        k.template_args,
        k.host_fn,
        k.params,
        k.touches,
        k.pdl,
        k.reads_before_wait,
    )


def fused_ops(model: LayerStack, macros: tuple[str, ...], rows_per_warp: int, warps: int = 8) -> list[Any]:
    a, b = variant(library.rms_norm_matvec, macros), variant(library.matvec_add, macros)
    ops = []
    for w, buf in zip(model.weights, model.buffers, strict=True):
        n, k = w.wq.shape
        grid = -(-n // (warps * rows_per_warp))
        ops += [
            a[grid, 32 * warps, 4 * k](buf.q.mut(), model.hidden, w.norm_w, w.wq, model.cfg.eps, n, k),
            b[grid, 32 * warps, 4 * k](model.hidden.mut(), buf.q, w.wo, n, k),
        ]
    return ops


def graph(stream: sg.Stream, ops: list[Any], pdl: bool) -> CudaGraph:
    with CudaGraph.scope(stream, pdl=pdl) as s:
        for op in ops:
            s.record(op)
    return s.graph


def main() -> int:
    dev = sg.device("cuda")
    stream = dev.stream()
    t0 = time.perf_counter()
    big = Config(d=2048, n_layers=22)
    bw = bandwidths(dev, big.weight_bytes)
    print("bandwidths GB/s: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in bw.items()), flush=True)
    ceiling = bw["read_only"] / big.weight_bytes
    print(f"read-only ceiling at d=2048 x 22: {ceiling:.0f} tokens/s", flush=True)

    chain = Chain(dev, 88 if "--chain" in sys.argv else 2, 8 << 20)
    gs = {p: chain.record(stream, p) for p in (True, False)}
    t = interleaved({str(p): (g.launch, g.sync, 20) for p, g in gs.items()}, rounds=3)
    print(
        f"chain {len(chain.weights)} x 8 MiB: full {t['False']['wall'] * 1e6:.0f} us, "
        f"programmatic {t['True']['wall'] * 1e6:.0f} us ({t['False']['wall'] / t['True']['wall']:.2f}x, "
        f"{chain.nbytes / t['True']['wall'] / 1e9:.0f} GB/s)",
        flush=True,
    )
    for g in gs.values():
        g.close()
    chain.free()

    x0 = np.random.default_rng(5).standard_normal(2048).astype(np.float32)
    results = []
    for d in (2048, 512):
        cfg = Config(d=d, n_layers=22)
        model = LayerStack(dev, cfg)
        start = dev.from_numpy(x0[:d])
        want = reference_forward(model.host_weights, x0[:d], cfg.eps, 3)
        cases: list[tuple[str, list[Any]]] = []
        variants: list[tuple[str, tuple[str, ...], int, int]] = [  # label, macros, rows per warp, warps per block
            ("default (bounds 256,3)", (), 1, 8),
            ("no bounds", ("SG_MATVEC_BOUNDS=",), 1, 8),
            ("late trigger", ("SG_LATE_TRIGGER=1",), 1, 8),
            ("no L2 prefetch", ("SG_L2_PREFETCH=0",), 1, 8),
            ("bounds 256,3 chunk8", ("CHUNK=8",), 1, 8),
            ("bounds 256,3 chunk4", ("CHUNK=4",), 1, 8),
            ("bounds 128,6 w4", ("SG_MATVEC_BOUNDS=__launch_bounds__(128,6)",), 1, 4),
        ]
        for label, macros, rpw, warps in variants:
            if d == 2048 and "chunk" in label:
                continue
            cases.append((f"fused {label} r{rpw} w{warps}", fused_ops(model, macros, rpw, warps)))
        for form in ("kernels", "seed"):
            cases.append((f"{form} (library defaults)", model.ops(form)))
        for name, ops in cases:
            gs = {p: graph(stream, ops, p) for p in (True, False)}
            got = {}
            for p, g in gs.items():
                g.update(sg.memcpy(model.hidden.mut(), start))
                for _ in range(3):
                    g.launch()
                g.sync()
                got[p] = model.hidden.numpy()
            t = interleaved({str(p): (g.launch, g.sync, 64) for p, g in gs.items()}, rounds=3, inner=3)
            on, off = 1 / t["True"]["wall"], 1 / t["False"]["wall"]
            err = relative_error(got[True], want)
            same = bool(np.array_equal(got[True], got[False]))
            line = (
                f"d={d:5} {name:<34} PDL on {on:8.0f} tok/s ({on * cfg.weight_bytes / 1e9:5.0f} GB/s, "
                f"{on / (bw['read_only'] / cfg.weight_bytes):6.1%} of read-only)  "
                f"off {off:8.0f}  on/off {on / off:5.2f}  "
                f"identical {same}  err {err:.1e}  spread {t['True']['spread']:.1%}"
            )
            print(line, flush=True)
            results.append(line)
            for g in gs.values():
                g.close()
        for w in [*(w for lw in model.weights for w in (lw.norm_w, lw.wq, lw.wo)), model.hidden, start]:
            w.free()
    print(f"tuning done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
