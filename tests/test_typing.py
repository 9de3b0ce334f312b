"""mypy, with the scopegraph plugin, over pass and fail snippet files (the numpy-typing way):
every ``# E: code`` line must produce exactly that error code, no other line may produce any,
and the pass files must produce none."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ROOT / "tests" / "typing"
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$")
EXPECT = re.compile(r"#\s*E:\s*(?P<codes>[a-z-]+(?:\s*,\s*[a-z-]+)*)")


def run_mypy(files: list[Path]) -> tuple[dict[tuple[str, int], list[str]], str]:
    out, err, _ = api.run(["--config-file", str(ROOT / "mypy.ini"), "--no-incremental", *map(str, files)])
    found: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in out.splitlines():
        m = ERROR.match(line)
        if m:
            found[(Path(m["file"]).name, int(m["line"]))].append(m["code"])
    return found, out + err


@pytest.fixture(scope="module")
def fail_results() -> tuple[dict[tuple[str, int], list[str]], str]:
    return run_mypy(sorted((SNIPPETS / "fail").glob("*.py")))


def expected(path: Path) -> dict[tuple[str, int], list[str]]:
    want: dict[tuple[str, int], list[str]] = {}
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        m = EXPECT.search(text)
        if m:
            want[(path.name, number)] = [c.strip() for c in m["codes"].split(",")]
    return want


@pytest.mark.parametrize("path", sorted((SNIPPETS / "fail").glob("*.py")), ids=lambda p: p.name)
def test_fail_snippets(path: Path, fail_results: tuple[dict[tuple[str, int], list[str]], str]) -> None:
    found, output = fail_results
    want = expected(path)
    assert want, f"{path.name} marks no expected errors"
    got = {key: sorted(codes) for key, codes in found.items() if key[0] == path.name}
    assert got == {key: sorted(codes) for key, codes in want.items()}, output


def test_pass_snippets_and_examples_are_clean() -> None:
    files = sorted((SNIPPETS / "pass").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))
    found, output = run_mypy(files)
    assert not found, output


def test_messages_name_the_kernel_and_the_borrows(fail_results: tuple[dict[tuple[str, int], list[str]], str]) -> None:
    _, output = fail_results
    assert 'Argument 1 to "axpy" has incompatible type "Tensor"; expected "Mut[Tensor]"' in output
    assert "__call__" not in output
    # A launch held in a variable or a container is named too (issue 4), and one whose kernel no
    # expression names is still not `"__call__" of "Launcher"`.
    held = (
        (SNIPPETS / "fail" / "plugin_forms.py").read_text().splitlines().index("launch(y.mut(), x, 1.0)  # E: call-arg")
    )
    assert f'plugin_forms.py:{held + 1}: error: Missing positional argument "n" in call to "axpy"' in output
    assert 'Missing positional argument "n" in call to "kernels[\'axpy\']"' in output  # in mypy's quotes
    assert 'cannot borrow `by_name["y"]` as immutable' in output  # a string key as written (double quotes)
    # An unexpected keyword is not said to be "defined in" scopegraph's own launcher module.
    assert 'Unexpected keyword argument "m" for "axpy"' in output and "scopegraph._kernel" not in output
    assert 'Too few arguments for "kernel launch"' in output
    assert (
        'Argument "n" to "axpy" has incompatible type "bool"; expected "int" (a kernel scalar takes no bool' in output
    )
    assert "cannot borrow `self.bufs.norm` as immutable because it is also borrowed as mutable" in output
    assert "note: mutable borrow of `bufs[0]` occurs here (argument 1)" in output
    assert "cannot borrow `x` as mutable more than once at a time" in output
    # Keyword arguments are named, and the later borrow in the call as written is the one refused.
    assert "cannot borrow `y` as mutable because it is also borrowed as immutable" in output
    assert 'note: immutable borrow of `y` occurs here (argument "src")' in output
    assert "note: first mutable borrow of `bufs[0]` occurs here (writes[0])" in output


def test_an_ignored_borrow_error_takes_its_notes_along(tmp_path: Path) -> None:
    """A `# type: ignore[scopegraph-borrow]` on a call spread over lines (as a formatter writes a
    long launch) silenced the error but left its two notes, on the arguments' lines, under no error."""
    snippet = tmp_path / "spread.py"
    snippet.write_text(
        "import scopegraph as sg\n"
        "from scopegraph import library\n"
        "\n"
        'x = sg.device("host").zeros((4,))\n'
        "silenced = library.add_op(  # type: ignore[scopegraph-borrow]\n"
        "    x.mut(),\n"
        "    x,\n"
        "    x,\n"
        ")\n"
        "reported = library.add_op(\n"
        "    x.mut(),\n"
        "    x,\n"
        "    x,\n"
        ")\n"
    )
    _, output = run_mypy([snippet])
    lines = [line.split(": ", 1)[0].rsplit(":", 1)[-1] for line in output.splitlines() if line.startswith(str(snippet))]
    assert lines == ["10", "11", "12"], output  # the second call's error, then a note on each borrow
