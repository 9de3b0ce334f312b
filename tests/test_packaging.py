"""A user's own project type-checks against an installed scopegraph, editable or not.

Each case copies the distribution's sources to a temporary directory, installs them into a fresh
virtual environment (offline: no dependencies, no build isolation; the environment reaches this
interpreter's site-packages through a .pth line, so numpy, mypy and cuda.core come from there), and
runs ``mypy --strict`` with the scopegraph plugin in a throwaway project elsewhere. mypy must report
exactly the planted errors, and none inside scopegraph or its cuda stubs even with site-packages
errors unsilenced.

The environment is not made with ``--system-site-packages``: that would also run this
interpreter's own .pth files, and with them the developer's editable scopegraph, which could then
be what mypy finds instead of the copy under test.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]

# What a built distribution needs: the metadata, and the two top-level directories it installs.
DISTRIBUTION = ("pyproject.toml", "README.md", "scopegraph", "cuda-stubs")

APP = '''\
"""A user's graph program with two planted mistakes."""

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library


def build(dev: sg.Device) -> CudaGraph:
    stream = dev.stream()
    x = dev.from_numpy(np.arange(8, dtype=np.float32), name="x")
    y = dev.zeros((8,), sg.f32, name="y")
    with CudaGraph.scope(stream) as s:
        s.record(library.axpy[1, 32](y.mut(), x, 2.0, 8))
        s.record(library.add[1, 32](y.mut(), y, x, 8))  # planted: scopegraph-borrow
        s.record(sg.zeros((8,), sg.f32))  # planted: arg-type
    return s.graph


def main() -> None:
    with build(sg.device()) as graph:
        graph.launch()
        graph.sync()
'''

MYPY_INI = """\
[mypy]
strict = True
plugins = scopegraph.mypy_plugin
files = app
"""

ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: .*  \[(?P<code>[a-z-]+)\]$")


def planted() -> list[tuple[str, int, str]]:
    """(file, line, code) of every ``# planted: code`` mark in APP."""
    found = []
    for number, text in enumerate(APP.splitlines(), start=1):
        m = re.search(r"# planted: ([a-z-]+)", text)
        if m:
            found.append((os.path.join("app", "main.py"), number, m[1]))
    return found


def clean_env() -> dict[str, str]:
    """This process's environment without anything that would point Python or mypy at the checkout."""
    drop = {"PYTHONPATH", "MYPYPATH", "PYTHONHOME", "PYTHONSTARTUP", "PIP_REQUIRE_VIRTUALENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def make_venv(path: Path) -> Path:
    """A fresh environment that sees this interpreter's installed packages but not its .pth files."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=clean_env())
    python = path / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], path).stdout
    outer = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        outer.append(site.getusersitepackages())
    Path(purelib.strip(), "_scopegraph_test_outer.pth").write_text("".join(f"{d}\n" for d in outer))
    return python


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        setuptools_version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed (pip install -e '.[test]')")
    if int(setuptools_version.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools_version} is older than the build needs (pip install -e '.[test]')")
    dest = tmp_path_factory.mktemp("dist") / "scopegraph-src"
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in DISTRIBUTION:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user-project")
    (path / "app").mkdir()
    (path / "app" / "__init__.py").write_text("")
    (path / "app" / "main.py").write_text(APP)
    (path / "mypy.ini").write_text(MYPY_INI)
    return path


@dataclass(frozen=True)
class Installed:
    editable: bool
    python: Path  # the environment's interpreter
    package: Path  # where the environment imports scopegraph from
    stubs: Path  # where cuda-stubs lies


@pytest.fixture(scope="module", params=[True, False], ids=["editable", "wheel"])
def installed(
    request: pytest.FixtureRequest, source: Path, project: Path, tmp_path_factory: pytest.TempPathFactory
) -> Installed:
    editable: bool = request.param
    venv = tmp_path_factory.mktemp("venv-editable" if editable else "venv-wheel")
    python = make_venv(venv)
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    install += ["--disable-pip-version-check", *(["-e"] if editable else []), str(source)]
    done = run(install, venv)
    assert done.returncode == 0, done.stdout + done.stderr
    # Imported from the user's project directory, scopegraph is the copy under test.
    where = run([str(python), "-c", "import scopegraph; print(scopegraph.__file__)"], project)
    assert where.returncode == 0, where.stderr
    package = Path(where.stdout.strip()).parent
    if editable:
        assert package == source / "scopegraph"
    else:
        assert venv in package.parents
    return Installed(editable, python, package, package.parent / "cuda-stubs")


def test_installed_files(installed: Installed) -> None:
    assert (installed.package / "py.typed").is_file()
    assert (installed.package / "kernels" / "library.cu").is_file()
    assert (installed.stubs / "core" / "__init__.pyi").is_file()
    assert (installed.stubs / "py.typed").read_text().strip() == "partial"


def test_one_version_string(installed: Installed) -> None:
    written = re.search(r'__version__ = "([^"]+)"', (ROOT / "scopegraph" / "_version.py").read_text())
    assert written is not None
    done = run(
        [str(installed.python), "-c", "from importlib import metadata; print(metadata.version('scopegraph'))"],
        ROOT.parent,
    )
    assert done.stdout.split() == [written[1]], done.stderr


def test_user_project_sees_exactly_the_planted_errors(installed: Installed, project: Path, tmp_path: Path) -> None:
    done = run([str(installed.python), "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], project)
    got = [(m["path"], int(m["line"]), m["code"]) for m in map(ERROR.match, done.stdout.splitlines()) if m]
    assert got == planted(), done.stdout + done.stderr
    assert done.stdout.rstrip().endswith(f"Found {len(planted())} errors in 1 file (checked 2 source files)"), (
        done.stdout
    )


def test_no_error_inside_scopegraph_or_its_stubs(installed: Installed, project: Path, tmp_path: Path) -> None:
    """With site-packages errors unsilenced, mypy finds nothing wrong in scopegraph or cuda-stubs,
    and every scopegraph and cuda import resolves (numpy's own stubs may still have complaints)."""
    mypy = [str(installed.python), "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-silence-site-packages"]
    done = run(mypy, project)
    ours = (installed.package.resolve(), installed.stubs.resolve())
    unresolved = re.compile(r'"(scopegraph|cuda)[."].*\[import-(untyped|not-found)\]')
    inside = []
    for line in done.stdout.splitlines():
        m = re.match(r"^(?P<path>.+?):\d+: (error|note): ", line)
        path = (project / m["path"]).resolve() if m else None
        in_ours = path is not None and any(root == path or root in path.parents for root in ours)
        if in_ours or unresolved.search(line):
            inside.append(line)
    assert not inside, "\n".join(inside)
    assert any(line.startswith(os.path.join("app", "main.py")) for line in done.stdout.splitlines()), done.stdout


def test_wheel_modules_import_outside_the_checkout(installed: Installed, tmp_path: Path) -> None:
    """Every module of the installed package imports with only the install on the path (no stray imports of the
    checkout's other directories, no package data left out)."""
    if installed.editable:
        pytest.skip("an editable install imports from the checkout by design")
    script = (
        "import importlib, pkgutil, scopegraph\n"
        "names = [m.name for m in pkgutil.walk_packages(scopegraph.__path__, 'scopegraph.')]\n"
        "for name in names:\n"
        "    if not name.endswith('__main__'):\n"
        "        importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    done = run([str(installed.python), "-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10


def test_this_checkout_does_not_shadow_a_projects_own_tests_package(tmp_path: Path) -> None:
    """An editable install puts the checkout on sys.path; its tests/ must not hide a project's own
    `tests` (pytest's usual layout has no __init__.py there, a namespace package)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "util.py").write_text("VALUE = 42\n")
    done = subprocess.run(
        [sys.executable, "-c", "from tests.util import VALUE; print(VALUE)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr
