"""Suite 2b, programmatic dependent launch on and off: the same program recorded with
``CudaGraph.scope(stream, pdl=True)`` and ``pdl=False``, replays timed side by side (interleaved),
and whether both give bit-identical results.

- The synthetic chain: 88 kernels, each streaming its own 8 MiB of weights before its wait and
  depending on the kernel before it through a 256-float vector (``_chain``).
- The seed model, in each form (seed: 5 nodes a layer with a memcpy, which keeps full edges
  around it; kernels: 4 kernels a layer; fused: 2 kernels a layer), at d=2048 and d=512, 22 layers.

On the host backend and below sm_90 nothing changes (the suite still runs: results identical,
times equal within noise).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import CudaGraph, Device, memcpy
from ..._pdl import executable_deps
from ..seed_model import FORMS, Config, LayerStack
from ._chain import Chain
from ._model import record
from ._table import markdown
from ._timing import figure, interleaved, part


def run(dev: Device, quick: bool) -> dict[str, Any]:
    rounds, inner = (2, 1) if quick else (5, 3)
    length, nbytes = (88, 8 << 20) if dev.is_cuda and not quick else (8, 1 << 16)
    stream = dev.stream()
    chain = Chain(dev, length, nbytes)
    graphs = {pdl: chain.record(stream, pdl) for pdl in (True, False)}
    out: dict[str, Any] = {"chain": {"kernels": length, "bytes_per_kernel": nbytes}}
    results = {}
    for pdl, g in graphs.items():
        g.launch()
        g.sync()
        results[pdl] = chain.vectors[-1].numpy()
    calls = 20 if dev.is_cuda else 2
    timed = interleaved({f"pdl_{p}": (g.launch, g.sync, calls) for p, g in graphs.items()}, rounds=rounds, inner=inner)
    out["chain"] |= _row(timed, chain.nbytes, bool(np.array_equal(results[True], results[False])))
    out["chain"] |= _edges(graphs[True])
    for g in graphs.values():
        g.close()
    chain.free()

    rows = []
    sizes = ((2048, 22), (512, 22)) if dev.is_cuda else ((64, 4),)
    for d, n_layers in sizes if not quick else sizes[:1]:
        cfg = Config(d=d, n_layers=n_layers)
        model = LayerStack(dev, cfg)
        x0 = dev.from_numpy(np.random.default_rng(4).standard_normal(d).astype(np.float32))
        for form in FORMS:
            graphs = {pdl: record(model, form, pdl) for pdl in (True, False)}
            results = {}
            for pdl, g in graphs.items():
                g.update(memcpy(model.hidden.mut(), x0))
                for _ in range(3):
                    g.launch()
                g.sync()
                results[pdl] = model.hidden.numpy()
            tokens = 64 if dev.is_cuda and not quick else 2
            timed = interleaved(
                {f"pdl_{p}": (g.launch, g.sync, tokens) for p, g in graphs.items()}, rounds=rounds, inner=inner
            )
            row = {"d": d, "n_layers": n_layers, "form": form, "kernels_per_layer": FORMS[form][0]}
            row |= _row(timed, cfg.weight_bytes, bool(np.array_equal(results[True], results[False])))
            row |= _edges(graphs[True])
            rows.append(row)
            for g in graphs.values():
                g.close()
        for t in [*model.tensors(), x0]:
            t.free()
    out["model"] = rows
    return out


def _edges(graph: CudaGraph) -> dict[str, int]:
    """The recorded edges (graph.edges), those the CUDA graph is built with (implied ones left
    out: scopegraph._tracker.without_implied), and how many of the latter are programmatic."""
    driver = executable_deps(graph.nodes)
    programmatic = 0
    if graph.programmatic_edges:  # none on the host, below sm_90, or recorded with pdl=False
        programmatic = sum(d in graph.nodes[n].programmatic for n, deps in enumerate(driver) for d in deps)
    return {"edges": len(graph.edges), "driver_edges": sum(map(len, driver)), "programmatic_edges": programmatic}


def _row(timed: dict[str, dict[str, float]], nbytes: int, identical: bool) -> dict[str, Any]:
    """Per side (on, off): seconds a replay and bytes per second, best (the plain figures), median and spread."""
    row: dict[str, Any] = {}
    for side, t in (("on", timed["pdl_True"]), ("off", timed["pdl_False"])):
        row |= figure(f"{side}_s", part(t)) | figure(f"{side}_bandwidth", part(t), scale=nbytes, rate=True)
    return row | {"speedup": row["off_s"] / row["on_s"], "identical": identical, "timing": timed}


def format_rows(r: dict[str, Any]) -> list[str]:
    heads = ["graph", "edges", "driver", "prog.", "PDL off us", "PDL on us", "on/off", "GB/s off", "GB/s on"]
    heads.append("identical")

    def cells(name: str, row: dict[str, Any]) -> list[str]:
        edges = [str(row[k]) for k in ("edges", "driver_edges", "programmatic_edges")]
        times = [f"{row['off_s'] * 1e6:.1f}", f"{row['on_s'] * 1e6:.1f}", f"{row['speedup']:.2f}"]
        rates = [f"{row['off_bandwidth'] / 1e9:.0f}", f"{row['on_bandwidth'] / 1e9:.0f}"]
        return [name, *edges, *times, *rates, "yes" if row["identical"] else "NO"]

    c = r["chain"]
    rows = [cells(f"chain {c['kernels']} x {c['bytes_per_kernel'] / 2**20:g} MiB", c)]
    for row in r["model"]:
        k, other = FORMS[row["form"]]
        per_layer = f"{k} kernels" + (f" + {other} memcpy" if other else "")
        rows.append(cells(f"model d={row['d']} x {row['n_layers']}, {row['form']}: {per_layer}", row))
    return [
        "## 2b. programmatic dependent launch: the same graph recorded with pdl=True and pdl=False "
        "(best of 5 interleaved round medians; edges: recorded, driver: in the CUDA graph, implied ones left out, "
        "prog.: programmatic among those)",
        *markdown(heads, rows, labels=1),
    ]
