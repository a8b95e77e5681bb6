"""``pip install .`` and a built wheel give a working ``attnkit`` (issue 23, item 7): the wheel, built offline from
a copy of the sources, holds the report's .js/.css, declares the extras the Makefile installs, and its
``attnkit`` runs from an installed copy (not from ``src/``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import attnkit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the folder it is installed into with ``pip install --target``)."""
    work = tmp_path_factory.mktemp("packaging")
    src = work / "src"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)  # built from a copy: setuptools' build/ never lands in the repository
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(work / "dist"),
                    str(src)], check=True, capture_output=True, text=True, cwd=work)
    wheel = next((work / "dist").glob("attnkit-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(work / "site"), str(wheel)],
                   check=True, capture_output=True, text=True, cwd=work)
    return wheel, work / "site"


def _run_installed(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy first, never the repository's src/
    return subprocess.run([str(site / "bin" / "attnkit"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_holds_the_package_data_and_the_entry_point(installed):
    wheel, _ = installed
    assert wheel.name == f"attnkit-{attnkit.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(f"attnkit-{attnkit.__version__}.dist-info/entry_points.txt").decode()
    package = ROOT / "src" / "attnkit"  # not src/*.egg-info, which `pip install -e` leaves beside it
    data = {str(p.relative_to(ROOT / "src")) for p in package.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert {"attnkit/diagnostics/report/report.js", "attnkit/diagnostics/report/report.css"} <= data
    assert data <= names, f"files of the package missing from the wheel: {sorted(data - names)}"
    py = {str(p.relative_to(ROOT / "src")) for p in package.rglob("*.py")}
    assert py <= names, f"modules missing from the wheel: {sorted(py - names)[:5]}"
    assert "attnkit = attnkit.cli.main:main" in entry_points


def test_the_wheel_declares_the_extras_the_makefile_installs(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"attnkit-{attnkit.__version__}.dist-info/METADATA").decode()
    provided = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, flags=re.M))
    used = set()
    for spec in re.findall(r'pip install[^\n]*"\.\[([^\]]+)\]"', (ROOT / "Makefile").read_text()):
        used |= set(spec.split(","))
    assert used and used <= provided, (used, provided)


def test_attnkit_runs_from_the_installed_copy(installed, tmp_path):
    _, site = installed
    version = _run_installed(site, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout == f"attnkit {attnkit.__version__}\n", version.stderr
    where = subprocess.run([sys.executable, "-c", "import attnkit; print(attnkit.__file__)"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert Path(where.stdout.strip()).is_relative_to(site)
    # the report inlines report.js / report.css: it can only be written if the package data were installed
    page = tmp_path / "nano.html"
    report = _run_installed(site, "report", "nano", "--text", "hi", "--out", str(page), "--no-doctor", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    js = (ROOT / "src" / "attnkit" / "diagnostics" / "report" / "report.js").read_text()
    assert js.strip().splitlines()[0] in page.read_text()
