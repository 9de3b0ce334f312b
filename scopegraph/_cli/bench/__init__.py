"""``python -m scopegraph bench``: the benchmark suites, a JSON file, a table and (with matplotlib) plots.

Every figure is measured side by side in one run; compare ratios, not absolute times across
machines. On the host backend only the record-cost suites (build, record) mean anything.
A figure that was not measured (PyTorch missing, or a GPU-only comparison on the host) is
left out of its JSON row and shown as ``-`` in the table, in every suite alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import Device
from . import _build, _dataflow, _launch, _model, _record
from ._timing import environment, ratio, us

SUITES: dict[str, Callable[..., dict[str, Any]]] = {
    "launch": _launch.run,
    "model": _model.run,
    "build": _build.run,
    "dataflow": _dataflow.run,
    "record": _record.run,
}


def run(out_dir: Path, dev: Device, quick: bool = False, only: list[str] | None = None) -> dict[str, Any]:
    """Run the suites (all, or those in ``only``) on ``dev``; write bench.json, bench.txt and plots."""
    results: dict[str, Any] = {"environment": environment(dev), "quick": quick}
    for name, suite in SUITES.items():
        if only and name not in only:
            continue
        print(f"running {name} ...", flush=True)
        t0 = time.perf_counter()
        results[name] = suite(dev, quick)
        print(f"  {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(results, indent=2))
    table = format_table(results)
    (out_dir / "bench.txt").write_text(table)
    print(table)
    plot(results, out_dir)
    return results


def format_table(r: dict[str, Any]) -> str:
    lines = ["# scopegraph benchmarks", "", "environment: " + ", ".join(f"{k}={v}" for k, v in r["environment"].items())]
    if r["environment"]["device"] == "host":
        lines.append("NOTE: host backend: only the record costs (sections 3, 5 and 6) mean anything; GPU timings need a GPU.")
        lines.append("'-' marks a figure not measured: the PyTorch and cuda.core comparisons run on CUDA only.")
    elif r["environment"]["torch"] == "not installed":
        lines.append("'-' marks a figure not measured: PyTorch is not installed.")
    if "launch" in r:
        lines += ["", "## 1. launch overhead: N dependent tiny kernels (x += 1), microseconds per node (wall; CPU submit)",
                  f"{'N':>6} {'sg eager':>20} {'sg graph':>20} {'cuda.core graph':>20} {'sg/core':>8} {'cuda.core eager':>20} {'torch eager':>20} {'torch graph':>20}"]
        for row in r["launch"]["rows"]:
            def cell(key: str) -> str:
                v = row.get(key)
                return f"{us(v['wall'])} ({us(v['submit']).strip():>6})" if v else f"{'-':>20}"
            sg_core = ratio(row["sg_graph"]["wall"], row["core_graph"]["wall"]) if "core_graph" in row else "-"
            lines.append(f"{row['n']:>6} {cell('sg_eager')} {cell('sg_graph')} {cell('core_graph')} {sg_core:>8} "
                         f"{cell('core_eager')} {cell('torch_eager')} {cell('torch_graph')}")
    if "model" in r:
        m = r["model"]
        lines += ["", "## 2. the seed's model: tokens per second",
                  f"{'d':>5} {'layers':>6} {'sg eager':>10} {'sg graph':>10} {'graph/eager':>11} {'torch eager':>11} {'torch graph':>11} {'sg/torch graph':>14} {'GB/s':>8} {'of copy':>8}"]
        for row in m["rows"]:
            tg = row.get("torch_graph_tok_s")
            lines.append(
                f"{row['d']:>5} {row['n_layers']:>6} {row['sg_eager_tok_s']:>10.0f} {row['sg_graph_tok_s']:>10.0f} {row['graph_over_eager']:>11.2f} "
                f"{num(row.get('torch_eager_tok_s'), '.0f'):>11} {num(tg, '.0f'):>11} {ratio(row['sg_graph_tok_s'], tg):>14} "
                f"{row['graph_bandwidth'] / 1e9:>8.0f} {num(row.get('graph_fraction_of_copy'), '.1%'):>8}"
            )
        if "copy_bandwidth" in m:
            copies = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in m["copy_bandwidths"].items())
            lines.append(f"device-to-device copy (read + write, GB/s): {copies}; best {m['copy_bandwidth'] / 1e9:.0f}; "
                         f"44 back-to-back matvecs: {m['matvec_bandwidth'] / 1e9:.0f} GB/s = {m['matvec_fraction_of_copy']:.1%} of the best copy, "
                         f"{m['matvec_fraction_of_memcpy']:.1%} of memcpy")
    if "build" in r:
        lines += ["", "## 3. record and build cost",
                  f"{'ops':>6} {'record us/op':>12} {'build ms':>10} {'cuda.core ms':>12} {'build/core':>10}"]
        for row in r["build"]["rows"]:
            core = row.get("core_define_instantiate_s")
            lines.append(f"{row['n']:>6} {row['record_us_per_op']:>12.2f} {row['build_s'] * 1e3:>10.2f} "
                         f"{'-' if core is None else f'{core * 1e3:.2f}':>12} {ratio(row['build_s'], core):>10}")
    if "dataflow" in r:
        lines += ["", "## 4. dataflow parallelism: k chains of small kernels, one replay",
                  f"{'chains':>6} {'dataflow ms':>12} {'program ms':>12} {'speedup':>8}"]
        for row in r["dataflow"]["rows"]:
            lines.append(f"{row['chains']:>6} {row['dataflow_s'] * 1e3:>12.3f} {row['program_s'] * 1e3:>12.3f} {row['speedup']:>8.2f}")
    if "record" in r:
        rec = r["record"]
        lines += ["", f"## 5. record cost per op, partial writes: op i writes row x[i] ({rec['row_floats']} floats) of one allocation; "
                  "op built inside the clock",
                  f"{'ops':>6} {'memset us/op':>12} {'kernel us/op':>12} {'edges':>6} {'memset build ms':>15} {'kernel build ms':>15}"]
        for row in rec["partial_writes"]:
            lines.append(f"{row['n']:>6} {row['memset_us_per_op']:>12.2f} {row['kernel_us_per_op']:>12.2f} {row['edges']:>6} "
                         f"{row['memset_build_s'] * 1e3:>15.2f} {row['kernel_build_s'] * 1e3:>15.2f}")
        a = rec["after_readers"]
        lines += ["", f"## 6. small writes after {a['readers']} readers: {a['writes']} one-row writes of x after {a['readers']} ops that read all of x",
                  f"{'readers':>7} {'writes':>6} {'us/write':>9} {'edges/write':>11} {'last write edges':>16} {'join nodes':>10}",
                  f"{a['readers']:>7} {a['writes']:>6} {a['us_per_write']:>9.2f} {a['edges_per_write']:>11.1f} "
                  f"{a['last_write_edges']:>16} {a['extra_nodes']:>10}"]
    return "\n".join(lines) + "\n"


def num(value: float | None, spec: str) -> str:
    """``value`` formatted, or ``-`` when it was not measured."""
    return "-" if value is None else format(value, spec)


def plot(r: dict[str, Any], out_dir: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if "launch" in r:
        fig, ax = plt.subplots(figsize=(6, 4))
        rows = r["launch"]["rows"]
        for key, label in (("sg_eager", "scopegraph eager"), ("sg_graph", "scopegraph graph"), ("core_graph", "cuda.core graph"),
                           ("torch_eager", "PyTorch eager"), ("torch_graph", "PyTorch CUDA graph")):
            pts = [(row["n"], row[key]["wall"] * 1e6) for row in rows if key in row]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="kernels per replay (N)", ylabel="µs per node", title="Launch overhead")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "launch_overhead.png", dpi=120)
    if "model" in r:
        fig, ax = plt.subplots(figsize=(6, 4))
        rows = [row for row in r["model"]["rows"] if row["d"] == r["model"]["d"]]
        layers = [row["n_layers"] for row in rows]
        ax.plot(layers, [row["graph_over_eager"] for row in rows], marker="o", label="scopegraph graph / eager")
        if all("torch_graph_tok_s" in row for row in rows):
            ax.plot(layers, [row["sg_graph_tok_s"] / row["torch_graph_tok_s"] for row in rows], marker="s", label="scopegraph graph / PyTorch graph")
        ax.set(xlabel="layers", ylabel="speedup (tokens/s ratio)", title=f"Seed model, d={r['model']['d']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "model_speedup.png", dpi=120)
