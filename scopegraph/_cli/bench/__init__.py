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
from . import _build, _cpu, _dataflow, _decode, _launch, _model, _pdl, _record, _update
from ._timing import environment, ratio

SUITES: dict[str, Callable[..., dict[str, Any]]] = {
    "launch": _launch.run,
    "model": _model.run,
    "pdl": _pdl.run,
    "cpu": _cpu.run,
    "build": _build.run,
    "dataflow": _dataflow.run,
    "record": _record.run,
    "decode": _decode.run,
    "update": _update.run,
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
    lines = [
        "# scopegraph benchmarks",
        "",
        "environment: " + ", ".join(f"{k}={v}" for k, v in r["environment"].items()),
    ]
    if r["environment"]["device"] == "host":
        lines.append(
            "NOTE: host backend: only the CPU costs (sections 2c, 3, 5 and 6) mean anything; GPU timings need a GPU."
        )
        lines.append("'-' marks a figure not measured: the PyTorch and cuda.core comparisons run on CUDA only.")
    elif r["environment"]["torch"] == "not installed":
        lines.append("'-' marks a figure not measured: PyTorch is not installed.")
    if "launch" in r:
        lines += ["", *_launch.format_rows(r["launch"])]
    if "model" in r:
        lines += ["", *_model.format_rows(r["model"])]
    if "pdl" in r:
        lines += ["", *_pdl.format_rows(r["pdl"])]
    if "cpu" in r:
        lines += ["", *_cpu.format_rows(r["cpu"])]
    if "build" in r:
        lines += [
            "",
            "## 3. record and build cost (record: each op built, checked and recorded inside the clock)",
            f"{'ops':>6} {'record us/op':>12} {'build ms':>10} {'cuda.core ms':>12} {'build/core':>10}",
        ]
        for row in r["build"]["rows"]:
            core = row.get("core_define_instantiate_s")
            lines.append(
                f"{row['n']:>6} {row['record_us_per_op']:>12.2f} {row['build_s'] * 1e3:>10.2f} "
                f"{'-' if core is None else f'{core * 1e3:.2f}':>12} {ratio(row['build_s'], core):>10}"
            )
    if "dataflow" in r:
        lines += [
            "",
            "## 4. dataflow parallelism: k chains of small kernels, one replay",
            f"{'chains':>6} {'dataflow ms':>12} {'program ms':>12} {'speedup':>8}",
        ]
        for row in r["dataflow"]["rows"]:
            lines.append(
                f"{row['chains']:>6} {row['dataflow_s'] * 1e3:>12.3f} {row['program_s'] * 1e3:>12.3f} "
                f"{row['speedup']:>8.2f}"
            )
    if "record" in r:
        rec = r["record"]
        lines += [
            "",
            "## 5. record cost per op, partial writes: op i writes row x[i] "
            f"({rec['row_floats']} floats) of one allocation; "
            "op built inside the clock",
            f"{'ops':>6} {'memset us/op':>12} {'kernel us/op':>12} {'edges':>6} "
            f"{'memset build ms':>15} {'kernel build ms':>15}",
        ]
        for row in rec["partial_writes"]:
            lines.append(
                f"{row['n']:>6} {row['memset_us_per_op']:>12.2f} {row['kernel_us_per_op']:>12.2f} {row['edges']:>6} "
                f"{row['memset_build_s'] * 1e3:>15.2f} {row['kernel_build_s'] * 1e3:>15.2f}"
            )
        a = rec["after_readers"]
        lines += [
            "",
            f"## 6. small writes after {a['readers']} readers: {a['writes']} one-row writes "
            f"of x after {a['readers']} ops that read all of x",
            f"{'readers':>7} {'writes':>6} {'us/write':>9} {'edges/write':>11} "
            f"{'last write edges':>16} {'join nodes':>10}",
            f"{a['readers']:>7} {a['writes']:>6} {a['us_per_write']:>9.2f} {a['edges_per_write']:>11.1f} "
            f"{a['last_write_edges']:>16} {a['extra_nodes']:>10}",
        ]
    if "decode" in r:
        lines += [
            "",
            "## 7. decode loop: K tokens inside one launch (a device-side while loop) "
            "vs K launches of the one-token graph, tokens/s",
            "('host decides': K launches, the host reading the loop's flag after each token "
            "to decide whether to go on)",
            f"{'d':>5} {'layers':>6} {'K':>4} {'one launch':>11} {'K launches':>11} {'loop/launches':>13} "
            f"{'identical':>9} "
            f"{'host decides':>12} {'loop/host decides':>17}",
        ]
        for row in r["decode"]["rows"]:
            lines.append(
                f"{row['d']:>5} {row['n_layers']:>6} {row['k']:>4} {row['loop_tok_s']:>11.1f} "
                f"{row['launches_tok_s']:>11.1f} "
                f"{row['loop_over_launches']:>13.3f} {'yes' if row['identical'] else 'NO':>9} "
                f"{num(row.get('host_decides_tok_s'), '.1f'):>12} {num(row.get('loop_over_host_decides'), '.3f'):>17}"
            )
    if "update" in r:
        u = r["update"]
        lines += [
            "",
            f"## 8. changing one kernel's argument every iteration (seed 004): {u['kernels']} dependent tiny "
            f"kernels, the last one's scalar (or input) new each iteration; {u['rounds']} interleaved rounds of "
            f"{u['calls']} iterations, medians",
            *_update.format_rows(u),
        ]
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
        for key, label in (
            ("sg_eager", "scopegraph eager"),
            ("sg_graph", "scopegraph graph"),
            ("core_graph", "cuda.core graph"),
            ("torch_eager", "PyTorch eager"),
            ("torch_graph", "PyTorch CUDA graph"),
        ):
            pts = [(row["n"], row[key]["wall"] * 1e6) for row in rows if key in row]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        ax.set(
            xscale="log", yscale="log", xlabel="kernels per replay (N)", ylabel="µs per node", title="Launch overhead"
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "launch_overhead.png", dpi=120)
    if "model" in r:
        _model.plot(r["model"], out_dir, plt)
