"""The README is executable documentation.

Every fenced ``python`` block runs, in order and in one namespace (each block continues the story of
the ones before it), on the host backend, in a fresh interpreter; the blocks together also pass
``mypy --strict`` with the scopegraph plugin. A block that cannot run (an illustrative fragment) must
say so with the line ``<!-- no-run -->`` right above its fence, which neither GitHub nor the docs
site shows; at most ``MAX_EXEMPT`` may. The top of the README stays the two commands a new user
types, and CI runs exactly the second one.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import scopegraph as sg
from scopegraph import library

from .helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_EXEMPT = 2
# A fence may be indented (a block inside a list item); its code is indented as much.
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>.*)$")


NO_RUN = "<!-- no-run -->"


@dataclass(frozen=True)
class Block:
    language: str
    line: int  # README line of the block's first code line (1-based)
    code: str
    exempt: bool  # marked with NO_RUN on the line above the fence


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        info = m["info"].split()
        end = i + 1
        while end < len(lines) and lines[end].strip() != m["fence"]:
            end += 1
        assert end < len(lines), f"README.md:{i + 1}: unclosed code fence"
        exempt = i > 0 and lines[i - 1].strip() == NO_RUN
        code = "\n".join(line.removeprefix(m["indent"]) for line in lines[i + 1 : end])
        found.append(Block(info[0] if info else "", i + 2, code + "\n", exempt))
        i = end + 1
    return found


def python_blocks() -> list[Block]:
    return [b for b in blocks(README.read_text()) if b.language == "python"]


def runnable() -> list[Block]:
    return [b for b in python_blocks() if not b.exempt]


def as_module(chosen: list[Block]) -> str:
    """The blocks as one module whose line numbers are the README's (everything else blank)."""
    lines = [""] * len(README.read_text().splitlines())
    for b in chosen:
        for offset, code in enumerate(b.code.splitlines()):
            lines[b.line - 1 + offset] = code
    return "\n".join(lines) + "\n"


def test_every_fence_is_seen() -> None:
    """Each fence line of the README (indented ones inside list items too) opens or closes a block
    the tests run, so no block escapes being run."""
    text = README.read_text()
    fences = [line for line in text.splitlines() if line.strip().startswith("```")]
    assert len(fences) == 2 * len(blocks(text))


def test_blocks_are_runnable_or_marked() -> None:
    everything = python_blocks()
    assert len(everything) >= 5, "the README should show the library in runnable code"
    exempt = [b.line for b in everything if b.exempt]
    assert len(exempt) <= MAX_EXEMPT, f"too many python blocks are exempt from running: README.md lines {exempt}"
    untagged = [b.line for b in blocks(README.read_text()) if not b.language]
    assert not untagged, f"code blocks without a language (python, bash, text): README.md lines {untagged}"


def test_block_parser() -> None:
    sample = "# t\n\n```python\nx = 1\n```\n\n<!-- no-run -->\n```python\nfragment(...)\n```\n\n````text\n```\n````\n"
    assert blocks(sample) == [
        Block("python", 4, "x = 1\n", False),
        Block("python", 9, "fragment(...)\n", True),
        Block("text", 13, "```\n", False),
    ]


# `print(...)  # what it prints`: the comment is the output, or that with a part elided ("..."), or
# the output followed by a remark (`# [] on the host backend; ...`). "about ..." is prose.
PRINTS = re.compile(r"\bprint\(.*\)\s+# (?P<shown>.*)$")


def shows(comment: str, printed: str) -> bool:
    if comment.startswith("about "):
        return True
    if "..." in comment:  # what it elides: the middle, or the end
        head, tail = comment.split("...", 1)
        return printed.startswith(head.rstrip()) and printed.endswith(tail.strip())
    return comment == printed or comment.startswith((printed + ":", printed + " "))


def test_python_blocks_run_on_the_host_backend(tmp_path: Path) -> None:
    """...and print what their `# ...` comments say they print (the first line of it)."""
    chosen = runnable()
    # One namespace, one block after the other, each compiled under its own README line numbers;
    # what each README line prints is kept, to compare with its comment.
    script = tmp_path / "run_readme.py"
    printed = tmp_path / "printed.json"
    script.write_text(
        "import io, json, sys\n"
        "shown = {}\n"
        "def recording_print(*args, **kwargs):\n"
        "    caller = sys._getframe(1)\n"
        f"    if caller.f_code.co_filename == {str(README)!r} and 'file' not in kwargs:\n"
        "        text = io.StringIO()\n"
        "        print(*args, file=text, **kwargs)\n"
        "        shown.setdefault(caller.f_lineno, text.getvalue())\n"
        "    print(*args, **kwargs)\n"
        "namespace = {'__name__': '__main__', 'print': recording_print}\n"
        f"for line, code in {[(b.line, b.code) for b in chosen]!r}:\n"
        "    print(f'--- README.md:{line}', flush=True)\n"
        f"    exec(compile('\\n' * (line - 1) + code, {str(README)!r}, 'exec'), namespace)\n"
        f"open({str(printed)!r}, 'w').write(json.dumps(shown))\n"
    )
    env = child_env(SCOPEGRAPH_DEVICE="host")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.count("--- README.md:") == len(chosen)
    output = {int(line): text for line, text in json.loads(printed.read_text()).items()}
    claims = [
        (n, m["shown"]) for n, text in enumerate(README.read_text().splitlines(), 1) if (m := PRINTS.search(text))
    ]
    assert len(claims) >= 10 and all(n in output for n, _ in claims)
    wrong = [
        f"README.md:{n}: says {c!r}, prints {output[n].splitlines()[0]!r}"
        for n, c in claims
        if not shows(c, output[n].splitlines()[0])
    ]
    assert not wrong, "\n".join(wrong)


def test_python_blocks_pass_mypy_strict_with_the_plugin(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    module = tmp_path / "readme_blocks.py"
    module.write_text(as_module(runnable()))
    out, err, _ = api.run(
        ["--config-file", str(ROOT / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"), str(module)]
    )
    errors = [line.replace(str(module), "README.md") for line in out.splitlines() if ": error:" in line]
    assert not errors, "\n".join(errors) + err


def test_top_of_the_readme_is_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "# scopegraph"
    assert lines[1:3] == ["", "```bash"]
    assert lines[3].startswith("pip install -e '.[cuda]' && python -m scopegraph demo")
    assert lines[4].startswith("pip install -e '.[test]' && ")
    assert lines[5] == "```"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = README.read_text().splitlines()[4].split("    #")[0].strip()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "set -euo pipefail" in ci
    assert command in [line.strip() for line in ci], f".ci/run does not run the README's command: {command}"


def test_library_kernel_signatures_match_the_declarations() -> None:
    text = README.read_text()
    kernels = {name: k for name, k in vars(library).items() if isinstance(k, sg.Kernel) and not name.startswith("_")}
    assert kernels
    for name, k in kernels.items():
        m = re.search(rf"`{name}\(([^)]*)\)`", text)
        assert m, f"the README's kernel table lacks `{name}(...)`"
        shown = [part.split(":")[0].strip() for part in m[1].split(",") if part.strip()]
        declared = list(inspect.signature(k.__wrapped__).parameters)
        assert shown == declared, f"README shows {name}({', '.join(shown)}), library declares {declared}"


def test_pytest_markers_named_in_the_readme_exist() -> None:
    plugin = (ROOT / "scopegraph" / "pytest_plugin.py").read_text()
    for marker in set(re.findall(r"@pytest\.mark\.(\w+)", README.read_text())):
        assert re.search(rf"[\"']{marker}:", plugin), f"the README names @pytest.mark.{marker}; the plugin has none"
