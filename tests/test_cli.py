"""The command line: --version, info, help text, argument refusals, progress output, bench rows.

Fast: everything runs on the host backend at tiny sizes, in-process where it can.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import scopegraph as sg
from scopegraph.__main__ import SUITES, build_parser, main
from scopegraph._cli import progress
from scopegraph._cli.bench import SUITES as RUNNABLE_SUITES
from scopegraph._cli.bench import format_table
from scopegraph._cli.info import probe_driver

ROOT = Path(__file__).resolve().parents[1]
HAS_GPU = bool(probe_driver().gpus)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main(argv)`` in-process: exit status, stdout, stderr."""
    try:
        code = main(argv, prog="python -m scopegraph")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_version_through_python_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scopegraph", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"scopegraph {sg.__version__}\n"


def test_info_reports_versions_driver_device_and_cache(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "host")
    code, out, err = run_main(["info"], capsys)
    assert code == 0 and not err
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert fields["scopegraph"].startswith(sg.__version__)
    for name in ("python", "numpy", "cuda.core", "cuda.bindings", "nvrtc", "driver", "kernel cache", "torch"):
        assert fields[name], name
    assert fields["default device"] == "host (SCOPEGRAPH_DEVICE=host is set)"
    if HAS_GPU:
        assert "sm_" in fields["cuda:0"]
    else:
        assert fields["gpus"] == "none"


def test_info_names_a_bad_environment_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "bogus")
    code, out, _ = run_main(["info"], capsys)
    assert code == 0
    assert "SCOPEGRAPH_DEVICE='bogus' is set but is not a device" in out
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", " ")  # blank is unset, for info as for sg.device()
    code, out, _ = run_main(["info"], capsys)
    assert code == 0 and "SCOPEGRAPH_DEVICE" not in out.split("default device", 1)[1].splitlines()[0]


@pytest.mark.parametrize("command", [[], ["info"], ["demo"], ["bench"]])
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main([*command, "--help"], capsys)
    assert code == 0
    assert "usage: python -m scopegraph" in out
    assert "``" not in out


def test_every_option_and_command_has_help() -> None:
    parser = build_parser("python -m scopegraph")
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action._get_subactions():
                assert sub.help, sub.dest
            parsers += list(action.choices.values())
    for p in parsers:
        assert p.description and "``" not in p.description, p.prog
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help and "``" not in action.help, (p.prog, action.dest)


REFUSED = [
    (["demo", "--layers", "0"], "argument --layers: must be at least 1, got 0"),
    (["demo", "--d", "0"], "argument --d: must be at least 1, got 0"),
    (["demo", "--tokens", "0"], "argument --tokens: must be at least 1, got 0"),
    (["demo", "--layers", "-3"], "argument --layers: must be at least 1, got -3"),
    (["demo", "--d", "-1"], "argument --d: must be at least 1, got -1"),
    (["demo", "--tokens", "many"], "argument --tokens: expected a positive whole number, got 'many'"),
    (["demo", "--device", "bogus"], "argument --device: expected host, cuda or cuda:N, got 'bogus'"),
    (["bench", "--device", "gpu"], "argument --device: expected host, cuda or cuda:N, got 'gpu'"),
    (["demo", "--device", "cuda:64"], "argument --device: selecting device 'cuda:64' failed"),
    (["bench", "--only", "nothing"], "argument --only: invalid choice: 'nothing'"),
    (["bench", "--out", ""], "argument --out: expected a directory, got an empty name (use . for this one)"),
    ([], "the following arguments are required: COMMAND"),
    # An unknown option is named, by the command it follows, before a missing command is.
    (["--bogus"], "python -m scopegraph: error: unrecognized arguments: --bogus"),
    (["demo", "--bogus"], "python -m scopegraph demo: error: unrecognized arguments: --bogus"),
    (["bench", "--quick", "--bogus", "x"], "python -m scopegraph bench: error: unrecognized arguments: --bogus x"),
]
if not HAS_GPU:
    REFUSED.append((["demo", "--device", "cuda"], "argument --device: selecting device 'cuda' failed"))


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[" ".join(a) or "nothing" for a, _ in REFUSED])
def test_bad_arguments_are_refused_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert not out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m scopegraph") and message in err, err
    assert "--help)" in err


def test_a_bad_environment_device_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "bogus")
    code, _, err = run_main(["demo", "--tokens", "1"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("python -m scopegraph demo: error: SCOPEGRAPH_DEVICE='bogus'"), err


def test_progress_to_a_log_is_one_line_per_step() -> None:
    out = io.StringIO()
    calls: list[int] = []
    seconds = progress.timed_loop("graph", 5, lambda: calls.append(1), lambda: None, out=out)
    assert len(calls) == 5 and seconds >= 0
    lines = out.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [["graph", f"{i}/5"] for i in range(1, 6)]
    assert "\r" not in out.getvalue()


def test_progress_of_a_long_loop_reports_every_step_up_to_the_total() -> None:
    out = io.StringIO()
    progress.timed_loop("eager", 100, lambda: None, lambda: None, steps=8, out=out)
    counts = [line.split()[1] for line in out.getvalue().splitlines()]
    assert counts == [f"{n}/100" for n in (13, 26, 39, 52, 64, 76, 88, 100)]
    assert progress.step_sizes(100, 8) == [13, 13, 13, 13, 12, 12, 12, 12]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_terminal_without_tqdm_is_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    out = Terminal()
    progress.timed_loop("graph", 3, lambda: None, lambda: None, out=out)
    assert len(out.getvalue().splitlines()) == 3 and "\r" not in out.getvalue()


def test_progress_in_a_terminal_uses_tqdm() -> None:
    pytest.importorskip("tqdm")
    out = Terminal()
    progress.timed_loop("graph", 3, lambda: None, lambda: None, out=out)
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


def test_demo_log_output_has_a_line_per_step() -> None:
    """Through a pipe, as in a log: every step of both loops is a line, with no carriage return."""
    done = subprocess.run(
        [sys.executable, "-m", "scopegraph", "demo", "--device", "host", "--d", "32", "--layers", "2", "--tokens", "8"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stdout
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.split()[0] == "graph"][:8] == [f"{i}/8" for i in range(1, 9)]
    assert [line.split()[1] for line in lines if line.split()[0] == "eager"][:4] == [f"{i}/4" for i in range(1, 5)]
    assert "2 layers" in lines[0] and "d=32" in lines[0]
    assert "validation:" in done.stdout and ": OK" in done.stdout


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    """`python -m scopegraph demo | head -1`: a BrokenPipeError traceback, exit 1. Now the exit
    status of a writer killed by SIGPIPE, and nothing on stderr."""
    command = [sys.executable, "-m", "scopegraph", "demo", "--device", "host", "--d", "8", "--layers", "1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"scopegraph demo on host")
        proc.stdout.close()  # the reader leaves
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, stderr
    assert stderr == ""


def test_a_broken_pipe_that_is_not_stdouts_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a reader that left stdout ends the command quietly: a broken socket or pipe elsewhere
    is a real error, and propagates."""
    from scopegraph._cli import demo

    def broken(*args: object) -> int:
        raise BrokenPipeError("a socket to another rank")

    monkeypatch.setattr(demo, "main", broken)
    with pytest.raises(BrokenPipeError, match="a socket to another rank"):
        main(["demo", "--device", "host"], prog="python -m scopegraph")


def test_demo_states_the_smaller_host_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["demo", "--device", "host", "--layers", "1", "--tokens", "1"], capsys)
    assert code == 0
    assert "d=256" in out.splitlines()[0]
    assert "the seed's model is d=2048: pass --d 2048 for the full size" in out


def test_bench_record_rows_on_the_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        ["bench", "--quick", "--only", "record", "--device", "host", "--out", str(tmp_path)], capsys
    )
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["environment"]["device"] == "host" and set(result) == {"environment", "quick", "record"}
    rows = result["record"]["partial_writes"]
    assert [row["n"] for row in rows] == [1000, 4000]
    for row in rows:
        assert row["memset_us_per_op"] > 0 and row["kernel_us_per_op"] > 0
        assert row["edges"] == 0 and row["kernel_edges"] == 0  # disjoint rows need no ordering
    after = result["record"]["after_readers"]
    assert after["readers"] == 2000 and after["us_per_write"] > 0
    assert after["edges_per_write"] >= 1 and after["last_write_edges"] >= 1  # each write follows the readers
    table = (tmp_path / "bench.txt").read_text()
    assert "## 5. record cost per op, partial writes" in table and "## 6. small writes after 2000 readers" in table
    assert table in out


def test_bench_plots_the_speedup_against_the_number_of_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")  # the plots are optional: without matplotlib the bench skips them
    code, _, _ = run_main(["bench", "--quick", "--only", "model", "--device", "host", "--out", str(tmp_path)], capsys)
    assert code == 0
    layers = [row["n_layers"] for row in json.loads((tmp_path / "bench.json").read_text())["model"]["rows"]]
    assert len(layers) > 1
    assert (tmp_path / "model_speedup.png").stat().st_size > 0


def test_every_bench_suite_can_be_chosen_with_only() -> None:
    assert tuple(RUNNABLE_SUITES) == SUITES


def test_bench_pdl_suite_counts_recorded_and_driver_edges_on_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run_main(["bench", "--quick", "--only", "pdl", "--device", "host", "--out", str(tmp_path)], capsys)
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())["pdl"]
    chain = result["chain"]
    assert chain["edges"] == chain["driver_edges"] == chain["kernels"] - 1 and chain["identical"]
    by_form = {row["form"]: row for row in result["model"]}
    # The 4-kernel form's write-after-read edges (x += b after the rms_norm that read x) are
    # implied by the chain rms_norm -> matvec -> matvec -> add: recorded, left out of the driver graph.
    kernels = by_form["kernels"]
    assert kernels["driver_edges"] == 4 * kernels["n_layers"] - 1 < kernels["edges"]
    assert all(row["programmatic_edges"] == 0 for row in result["model"])  # the host backend has no PDL
    assert "driver" in (tmp_path / "bench.txt").read_text()


def test_missing_figures_read_the_same_in_every_table() -> None:
    env = {"device": "cuda:0", "torch": "not installed"}
    row = {"sg_eager": {"wall": 1e-5, "submit": 1e-6}, "sg_graph": {"wall": 1e-6, "submit": 1e-7}, "n": 10}
    model = {
        "d": 2048,
        "n_layers": 22,
        "sg_eager_tok_s": 1000.0,
        "sg_graph_tok_s": 2000.0,
        "graph_over_eager": 2.0,
        "weight_bytes": 1,
        "graph_bandwidth": 1e12,
    }
    ceiling = {"bandwidths": {"read_only": 3e12, "memcpy": 2e12, "copy_kernel": 2.5e12}, "ceiling_bytes": 738e6}
    table = format_table(
        {"environment": env, "launch": {"rows": [row]}, "model": {"d": 2048, "rows": [model]} | ceiling}
    )
    launch, model_table = markdown_tables(table)  # the ceiling's line is text after the table, not a row
    assert launch[1] == ["10", "10.00 (1.00)", "1.00 (0.10)", "-", "-", "-", "-", "-", "-"]
    assert model_table[1][5:8] == ["-", "-", "-"]  # torch eager, torch graph, sg/torch
    assert "0" not in model_table[1]
    assert "PyTorch is not installed" in table and "\nceiling: a read-only streaming kernel over 738 MB" in table


def markdown_tables(text: str) -> list[list[list[str]]]:
    """The tables in ``text`` (rows of cells, the header row first), as a Markdown parser reads them
    (markdown-it-py with GitHub's table syntax; rich depends on it). Checks what makes them readable
    as plain text too: no colour codes or carriage returns, every line of a table as long as the
    others with its column bars in the same places, and every table line read into a table (a line
    of text run into a table would add a row)."""
    from markdown_it import MarkdownIt

    assert "\x1b" not in text and "\r" not in text
    tables: list[list[list[str]]] = []
    in_row = False
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        if token.type == "table_open":
            tables.append([])
        in_row = token.type == "tr_open" or (in_row and token.type != "tr_close")
        if token.type == "tr_open":
            tables[-1].append([])
        elif token.type == "inline" and in_row:
            tables[-1][-1].append(token.content)
    blocks: list[list[str]] = []
    for previous, line in zip(["", *text.splitlines()], text.splitlines(), strict=False):
        if line.startswith("|"):
            if not previous.startswith("|"):
                blocks.append([])
            blocks[-1].append(line)
    assert len(blocks) == len(tables), text  # a table the parser does not read as one
    for block, table in zip(blocks, tables, strict=True):
        bars = {tuple(i for i, c in enumerate(line) if c == "|") for line in block}
        assert len(bars) == 1, "\n".join(block)  # aligned columns, nothing wrapped onto a line of its own
        assert len(table) == len(block) - 1  # every line but the delimiter row is a row of the table
        assert [[cell.strip() for cell in line.split("|")[1:-1]] for line in block[:1] + block[2:]] == table
    return tables


def test_bench_tables_are_markdown_with_nothing_cut() -> None:
    """bench.txt's tables are Markdown a parser reads (GitHub's table syntax), aligned plain text in a
    log; a long label and a long figure are whole, on one line; names left, figures right."""
    from markdown_it import MarkdownIt

    from scopegraph._cli.bench import _tp

    label = "a label as long as a long kernel call: " + "add[1, 256](out.mut(), a, b, n) " * 8
    figures = {"wall": 1234.5678, "median": 2e-6, "spread": 0.5}
    env = {"device": "host", "torch": "not installed"}
    table = format_table({"environment": env, "cpu": {"ops": 1000, "rows": {label.strip(): figures}}})
    [cpu] = markdown_tables(table)
    assert cpu == [["what", "best", "median", "spread"], [label.strip(), "1234567800.00", "2.00", "50.0%"]]
    styles = [t.attrGet("style") for t in MarkdownIt().enable("table").parse(table) if t.type == "th_open"]
    assert styles == [None, "text-align:right", "text-align:right", "text-align:right"]
    tp_row = {"d": 2048, "layers": 22, "single_eager_tok_s": 100.0, "single_graph_tok_s": 200.0}
    tp_row |= {"tp_eager_tok_s": 150.0, "tp_graph_tok_s": 300.0, "err_graph_vs_single": 1e-7, "err_eager_vs_single": 0}
    [tp] = markdown_tables("\n".join(_tp.format_rows({"world": 2, "rows": [tp_row]})))
    assert tp[1] == ["2048", "22", "100.0", "200.0", "150.0", "300.0", "1.50", "1.0e-07", "yes"]


def assert_refused(code: int, out: str, err: str, message: str, lines: int = 1) -> None:
    """Exit status 2, nothing run, ``lines`` lines on stderr (the error, and a help line), no traceback."""
    assert code == 2, (code, out, err)
    assert not out, out
    assert err.count("\n") == lines and "Traceback" not in err, err
    assert err.startswith("python -m scopegraph") and message in err, err


def test_an_output_directory_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "bench.txt"
    a_file.write_text("not a directory")
    for out_dir, reason in [
        (a_file, "it is a file, not a directory"),
        (a_file / "inside", "a part of the path is a file, not a directory"),
    ]:
        code, out, err = run_main(
            ["bench", "--quick", "--only", "record", "--device", "host", "--out", str(out_dir)], capsys
        )
        assert_refused(code, out, err, f"argument --out: cannot write to {str(out_dir)!r}: {reason}")
        assert "--help)" in err
    code, out, err = run_main(["bench", "--gpus", "1", "--out", str(a_file)], capsys)
    assert_refused(code, out, err, "argument --out: cannot write to")


def test_a_model_too_big_for_the_memory_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["demo", "--device", "host", "--d", "100000000", "--layers", "1", "--tokens", "1"]
    code, out, err = run_main(argv, capsys)
    assert_refused(code, out, err, "a model of 1 layer at d=100000000 needs about")
    assert "PiB of host memory" in err and "use a smaller --d or --layers" in err
    # A size that passes the estimate but still runs out (numpy's MemoryError) is refused the same way.
    from scopegraph._cli import demo

    def out_of_memory(*args: object) -> None:
        raise MemoryError("Unable to allocate 1.0 TiB")

    monkeypatch.setattr(demo, "LayerStack", out_of_memory)
    code, out, err = run_main(["demo", "--device", "host", "--d", "16", "--layers", "1", "--tokens", "1"], capsys)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "a model of 1 layer at d=16 does not fit in host memory; use a smaller --d or --layers" in err


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_gpus_in_a_single_process_is_refused_like_any_other_mistake(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--gpus 2 without a launcher: one process, not two. The same error line as any other mistake
    (the command's prog, ``error:``, the option), then the command to run."""
    monkeypatch.setenv("SCOPEGRAPH_BOOTSTRAP", "single")
    out_dir = ["--out", str(tmp_path)] if command == "bench" else []
    code, out, err = run_main([command, "--device", "host", "--gpus", "2", *out_dir], capsys)
    assert_refused(
        code,
        out,
        err,
        f"python -m scopegraph {command}: error: argument --gpus: 2 needs 2 processes, one per GPU, "
        "but this program has 1",
        lines=2,
    )
    assert err.splitlines()[1] == f"help: run `torchrun --nproc-per-node 2 -m scopegraph {command} --gpus 2`"


def test_a_launch_environment_that_is_not_right_is_refused_with_its_help_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCOPEGRAPH_BOOTSTRAP", "socket")
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "SCOPEGRAPH_BOOTSTRAP_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run_main(["demo", "--device", "host", "--gpus", "2"], capsys)
    assert_refused(code, out, err, "demo: error: the socket bootstrap needs RANK", lines=2)
    assert err.splitlines()[1].startswith("help: launch with torchrun")
    if not HAS_GPU:
        monkeypatch.setenv("SCOPEGRAPH_BOOTSTRAP", "single")
        code, out, err = run_main(["demo", "--device", "cuda", "--gpus", "1"], capsys)
        assert_refused(code, out, err, "argument --device: selecting device 'cuda:0' failed", lines=2)
        assert err.splitlines()[1] == "help: the info command lists the GPUs here; or use --device host"


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bench --quick` with every suite on the host (CI has no GPU: the figures mean nothing, the
    code paths do), run once for the tests that read its bench.json and bench.txt."""
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--quick", "--device", "host", "--out", str(out)], prog="python -m scopegraph") == 0
    return out


def test_every_bench_suite_runs_on_the_host_and_gets_its_section(quick_bench: Path) -> None:
    """Each suite's results in bench.json, and each numbered section in bench.txt."""
    result = json.loads((quick_bench / "bench.json").read_text())
    assert set(SUITES) <= set(result)
    table = (quick_bench / "bench.txt").read_text()
    for section in ("## 1.", "## 2.", "## 2b.", "## 2c.", "## 3.", "## 4.", "## 5.", "## 6.", "## 7.", "## 8."):
        assert f"\n{section} " in table, section
    assert len(markdown_tables(table)) == 10  # one a section, each a Markdown table


# A timed figure's key: seconds (``_s``: also tokens/s), microseconds per op or write, bytes per second.
TIMED = re.compile(r"(_s|us_per_op|us_per_write|bandwidths?)$")
RATES = re.compile(r"(tok_s|bandwidths?)$")  # higher is better: the best is the highest


def figures_without_spread(tree: Any, path: str = "") -> tuple[list[str], int]:
    """The timed figures in a bench.json tree that lack their best, median or spread (or whose best
    is not the best), and how many timed figures there are. A figure is either an ``interleaved``
    side (a dict with ``wall``: ``median`` and ``spread`` beside it, and ``submit``'s own when it
    has one) or a key named by TIMED, a number or a dict of numbers, with ``KEY_best``,
    ``KEY_median`` and ``KEY_spread`` of the same shape beside it."""
    wrong: list[str] = []
    count = 0
    if isinstance(tree, list):
        for i, item in enumerate(tree):
            w, c = figures_without_spread(item, f"{path}[{i}]")
            wrong, count = wrong + w, count + c
        return wrong, count
    if not isinstance(tree, dict):
        return wrong, count
    if "wall" in tree:
        count += 1
        need = ["median", "spread"] + (["submit_best", "submit_median", "submit_spread"] if "submit" in tree else [])
        wrong += [f"{path}.{k}" for k in need if not isinstance(tree.get(k), float)]
        if not wrong and not (tree["wall"] <= tree["median"] and tree["spread"] >= 0):
            wrong.append(f"{path}: best {tree['wall']}, median {tree['median']}, spread {tree['spread']}")
    for key, value in tree.items():
        w, c = figures_without_spread(value, f"{path}.{key}")
        wrong, count = wrong + w, count + c
        if not TIMED.search(key) or isinstance(value, bool):
            continue
        count += 1
        values = value if isinstance(value, dict) else {"": value}
        parts = {k: tree.get(f"{key}_{k}") for k in ("best", "median", "spread")}
        if not all(isinstance(v, dict) if isinstance(value, dict) else isinstance(v, float) for v in parts.values()):
            wrong.append(f"{path}.{key}: " + ", ".join(f"{key}_{k}" for k, v in parts.items() if v is None))
            continue
        by_name: dict[str, Any] = {k: v if isinstance(value, dict) else {"": v} for k, v in parts.items()}
        for name in values:
            best, median, spread = (by_name[k].get(name) for k in ("best", "median", "spread"))
            if best is None or median is None or spread is None:
                wrong.append(f"{path}.{key}[{name}]: no best, median or spread")
            elif not ((best >= median) if RATES.search(key) else (best <= median)) or spread < 0:
                wrong.append(f"{path}.{key}[{name}]: best {best}, median {median}, spread {spread}")
    return wrong, count


def test_every_bench_figure_has_its_best_median_and_spread(quick_bench: Path) -> None:
    """Issue 11: every figure of every suite, in bench.json, with its minimum (best), median and
    spread over interleaved rounds; and in bench.txt, sections 3 to 8, as ``best (median, spread)``."""
    result = json.loads((quick_bench / "bench.json").read_text())
    for suite in SUITES:
        wrong, count = figures_without_spread(result[suite], suite)
        assert count > 0 and not wrong, (suite, wrong)
    tables = markdown_tables((quick_bench / "bench.txt").read_text())
    spread = re.compile(r"^-?[0-9.]+ \(-?[0-9.]+, [0-9.]+%\)$")
    # Sections 3, 4, 5, 6, 7 and 8 (after 1, 2, 2b and 2c): which columns hold a timed figure.
    timed_columns = [(1, 2), (1, 2), (1, 2, 4, 5), (2,), (3, 4, 7), (1, 2)]
    for table, columns in zip(tables[4:], timed_columns, strict=True):
        for row in table[1:]:
            assert all(spread.match(row[c]) for c in columns), (table[0], row)


def test_the_ceiling_gives_its_spread_and_an_older_record_reads_as_before() -> None:
    """The read-only ceiling's line gives best (median, spread) of each bandwidth; a record from
    before (single figures, no ``*_best``/``*_median``/``*_spread``) still makes the same tables."""
    from scopegraph._cli.bench._timing import figure, figures, summary

    env = {"device": "cuda:0", "torch": "not installed"}
    times = {"read_only": [0.25e-3, 0.24e-3, 0.26e-3], "memcpy": [1e-3, 1e-3, 1.1e-3], "copy_kernel": [1e-3] * 3}
    nbytes = {"read_only": 738e6, "memcpy": 2e9, "copy_kernel": 2e9}
    per = {k: figure("bandwidths", summary(t), scale=nbytes[k], rate=True) for k, t in times.items()}
    model: dict[str, Any] = {"d": 2048, "rows": [], "ceiling_bytes": 738e6} | figures("bandwidths", per)
    assert model["bandwidths"]["read_only"] == model["bandwidths_best"]["read_only"] == 738e6 / 0.24e-3
    line = next(x for x in format_table({"environment": env, "model": model}).splitlines() if "ceiling" in x)
    assert ": 3075 (2952, 8.0%) GB/s = 4167 (4000, 8.0%) tokens/s at d=2048 x 22;" in line
    assert "memcpy 2000 (2000, 10.0%) GB/s" in line and line.endswith("; best (median, spread) of interleaved rounds")

    old_model = {"d": 2048, "rows": [], "ceiling_bytes": 738e6, "bandwidths": model["bandwidths"]}
    per_iteration = {"no_graph": 1e-5, "recapture": 1e-5, "whole_update": 2e-5, "node_update": 3e-5, "rebind": 1e-5}
    old_update = {
        "kernels": 20,
        "calls": 200,
        "rounds": 7,
        "agree": True,
        "per_iteration_s": per_iteration,
        "submit_s": dict.fromkeys(per_iteration, 1e-6),
        "speedup_over_no_graph": dict.fromkeys(per_iteration, 1.0),
        "ratios": dict.fromkeys(("whole_update/node_update", "recapture/whole_update", "rebind/node_update"), 1.0),
    }
    old = {
        "environment": env,
        "model": old_model,
        "build": {"rows": [{"n": 10, "record_us_per_op": 5.0, "build_s": 1e-3}]},
        "dataflow": {"rows": [{"chains": 1, "dataflow_s": 2e-3, "program_s": 3e-3, "speedup": 1.5}]},
        "update": old_update,
    }
    text = format_table(old)
    assert "(median" not in text and "cells: best" not in text and "interleaved rounds\n" not in text
    assert "3075 GB/s = 4167 tokens/s at d=2048 x 22;" in text and "200 iterations, medians" in text
    _, build, dataflow, update = markdown_tables(text)  # the model table has no rows here
    assert build[1] == ["10", "5.00", "1.00", "-", "-"] and dataflow[1] == ["1", "2.000", "3.000", "1.50"]
    assert update[4][:3] == ["node update (sg.Param)", "30.00", "1.00"]


def test_the_demo_runs_the_seeds_model_by_default_on_a_gpu() -> None:
    """Issue 13: on a GPU the demo is the seed's model (22 layers, d=2048) unless told otherwise."""
    from types import SimpleNamespace

    from scopegraph._cli.demo import Size, default_size

    gpu: Any = SimpleNamespace(is_cuda=True)
    assert default_size(gpu) == Size(d=2048, layers=22, tokens=512)
    assert default_size(sg.device("host")).layers == 22
