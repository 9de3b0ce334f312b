"""``python -m scopegraph bench --gpus N`` (under ``torchrun --nproc-per-node N``): the seed model split
over N GPUs (scopegraph._cli.tp) against the same model on one GPU, eager and as graphs, tokens per
second. Rank 0 writes DIR/bench-tp.json and DIR/bench-tp.txt and prints the table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..seed_model import Config
from ..tp import TOLERANCE, check_split, measure, ranks_match, start
from ._table import markdown
from ._timing import environment


def format_rows(r: dict[str, Any]) -> list[str]:
    heads = ["d", "layers", "1 GPU eager", "1 GPU graph", "N eager", "N graph", "graph N/1", "rel. err", "equal"]
    rows = []
    for row in r["rows"]:
        one_e, one_g = row["single_eager_tok_s"], row["single_graph_tok_s"]
        err = max(row["err_graph_vs_single"], row["err_eager_vs_single"])
        cells = [str(row["d"]), str(row["layers"]), f"{one_e:.1f}", f"{one_g:.1f}", f"{row['tp_eager_tok_s']:.1f}"]
        cells += [f"{row['tp_graph_tok_s']:.1f}", f"{row['tp_graph_tok_s'] / one_g:.2f}", f"{err:.1e}"]
        rows.append([*cells, "yes" if err < TOLERANCE else "NO"])
    return [
        f"## tensor parallelism: the seed model split over {r['world']} ranks (column-parallel Q, row-parallel O, "
        "one all-reduce a layer), tokens/s",
        *markdown(heads, rows),
    ]


def main(out_dir: Path, spec: str | None, quick: bool, gpus: int) -> int:
    comm = start(spec)
    try:
        if not ranks_match(comm, gpus, "bench"):
            return 2
        dev = comm.device
        sizes = [(256, 4)] if dev.is_host else ([(2048, 22)] if quick else [(512, 22), (2048, 22)])
        check_split([d for d, _ in sizes], comm.world_size, "--gpus")
        tokens = 16 if dev.is_host else (128 if quick else 512)
        rows = []
        for d, layers in sizes:
            f = measure(comm, Config(d=d, n_layers=layers), tokens)
            rows.append(asdict(f))
        if comm.rank == 0:
            result = {
                "environment": environment(dev),
                "world": comm.world_size,
                "bootstrap": comm.bootstrap.kind,
                "rows": rows,
            }
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "bench-tp.json").write_text(json.dumps(result, indent=2))
            table = "\n".join(format_rows(result)) + "\n"
            (out_dir / "bench-tp.txt").write_text(table)
            print(table)
        ok = all(max(row["err_graph_vs_single"], row["err_eager_vs_single"]) < TOLERANCE for row in rows)
        return 0 if ok else 1
    finally:
        comm.close()
