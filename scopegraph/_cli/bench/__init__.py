"""``python -m scopegraph bench``: the benchmark suites, a JSON file, a table and (with matplotlib) plots.

Every figure is measured side by side in one run; compare ratios, not absolute times across
machines. On the host backend only the record-cost suites (build, record) mean anything.
A figure that was not measured (PyTorch missing, or a GPU-only comparison on the host) is
left out of its JSON row and shown as ``-`` in the table, in every suite alike. The tables are
Markdown laid out by rich (``_table.markdown``): plain text, printed as written to bench.txt.

Every timed figure comes with its best (minimum), median and spread ((max - min) / median) over
interleaved rounds, every side of a comparison sampled alike (``_timing``): in bench.json either an
``interleaved`` side's dict (``wall`` the best, ``median``, ``spread``, and ``submit_*``), or
``KEY_best``, ``KEY_median`` and ``KEY_spread`` beside ``KEY``, which keeps the meaning it had in
older records (the best, or in sections 4, 7 and 8 the median). Sections 3 to 8 show them as
``best (median, spread)`` cells, the ceiling's line likewise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import Device
from . import _build, _cpu, _dataflow, _decode, _launch, _model, _pdl, _record, _update
from ._table import markdown
from ._timing import cell, environment, num, ratio

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


def _cells(suite: Any, then: str = "") -> list[str]:
    """The line under a section's heading that says what its cells hold, when they hold a figure's
    spread over rounds (not in an older record): then ``then``."""
    if '_spread"' not in json.dumps(suite):
        return []
    return ["cells: best (median, spread) over interleaved rounds; spread = (max - min) / median" + then]


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
        rows = []
        for row in r["build"]["rows"]:
            cells = [str(row["n"]), cell(row, "record_us_per_op", ".2f"), cell(row, "build_s", ".2f", 1e3)]
            cells.append(cell(row, "core_define_instantiate_s", ".2f", 1e3))
            rows.append([*cells, ratio(row["build_s"], row.get("core_define_instantiate_s"))])
        lines += [
            "",
            "## 3. record and build cost (record: each op built, checked and recorded inside the clock)",
            *_cells(r["build"], "; build/core: of the best"),
            *markdown(["ops", "record us/op", "build ms", "cuda.core ms", "build/core"], rows),
        ]
    if "dataflow" in r:
        rows = [
            [
                str(row["chains"]),
                cell(row, "dataflow_s", ".3f", 1e3),
                cell(row, "program_s", ".3f", 1e3),
                f"{row['speedup']:.2f}",
            ]
            for row in r["dataflow"]["rows"]
        ]
        lines += [
            "",
            "## 4. dataflow parallelism: k chains of small kernels, one replay",
            *_cells(r["dataflow"], "; speedup: of the medians"),
            *markdown(["chains", "dataflow ms", "program ms", "speedup"], rows),
        ]
    if "record" in r:
        rec, a = r["record"], r["record"]["after_readers"]
        rows = []
        for row in rec["partial_writes"]:
            cells = [str(row["n"]), *(cell(row, f"{way}_us_per_op", ".2f") for way in ("memset", "kernel"))]
            cells.append(str(row["edges"]))
            rows.append([*cells, *(cell(row, f"{way}_build_s", ".2f", 1e3) for way in ("memset", "kernel"))])
        after = [str(a["readers"]), str(a["writes"]), cell(a, "us_per_write", ".2f"), f"{a['edges_per_write']:.1f}"]
        after += [str(a["last_write_edges"]), str(a["extra_nodes"])]
        lines += [
            "",
            "## 5. record cost per op, partial writes: op i writes row x[i] "
            f"({rec['row_floats']} floats) of one allocation; "
            "op built inside the clock",
            *_cells(rec["partial_writes"]),
            *markdown(["ops", "memset us/op", "kernel us/op", "edges", "memset build ms", "kernel build ms"], rows),
            "",
            f"## 6. small writes after {a['readers']} readers: {a['writes']} one-row writes "
            f"of x after {a['readers']} ops that read all of x",
            *_cells(a),
            *markdown(["readers", "writes", "us/write", "edges/write", "last write edges", "join nodes"], [after]),
        ]
    if "decode" in r:
        heads = ["d", "layers", "K", "one launch", "K launches", "loop/launches", "identical", "host decides"]
        heads.append("loop/host decides")
        rows = []
        for row in r["decode"]["rows"]:
            cells = [str(row["d"]), str(row["n_layers"]), str(row["k"]), cell(row, "loop_tok_s", ".1f")]
            cells += [cell(row, "launches_tok_s", ".1f"), f"{row['loop_over_launches']:.3f}"]
            cells += ["yes" if row["identical"] else "NO", cell(row, "host_decides_tok_s", ".1f")]
            rows.append([*cells, num(row.get("loop_over_host_decides"), ".3f")])
        lines += [
            "",
            "## 7. decode loop: K tokens inside one launch (a device-side while loop) "
            "vs K launches of the one-token graph, tokens/s",
            "('host decides': K launches, the host reading the loop's flag after each token "
            "to decide whether to go on)",
            *_cells(r["decode"], "; ratios: of the medians"),
            *markdown(heads, rows),
        ]
    if "update" in r:
        u = r["update"]
        lines += [
            "",
            f"## 8. changing one kernel's argument every iteration (seed 004): {u['kernels']} dependent tiny "
            f"kernels, the last one's scalar (or input) new each iteration; {u['rounds']} interleaved rounds of "
            f"{u['calls']} iterations" + ("" if _cells(u) else ", medians"),
            *_cells(u, "; speedups and ratios: of the medians"),
            *_update.format_rows(u),
        ]
    return "\n".join(lines) + "\n"


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
