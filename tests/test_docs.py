"""The documentation site builds with warnings as errors, and shows every section of the README."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_readme_section_is_on_the_site() -> None:
    sections = set(re.findall(r"<!-- --8<-- \[start:([\w-]+)\] -->", (ROOT / "README.md").read_text()))
    assert sections, "the README marks no sections for the site"
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    included = set(re.findall(r'--8<-- "README\.md:([\w-]+)"', pages))
    assert sections == included, f"README sections missing from docs/: {sorted(sections - included)}"


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its future
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    api = (tmp_path / "api" / "index.html").read_text()
    for name in ("CudaGraph", "Scope", "Tensor", "kernel", "library.rms_norm"):
        assert f'id="scopegraph.{name}"' in api, f"the API reference lacks scopegraph.{name}"
    assert "cannot borrow" in (tmp_path / "static-checking" / "index.html").read_text()
