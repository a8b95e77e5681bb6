"""Install truth (issue 16 item 26): the set-up picks the CPU torch wheel where there is no GPU, through a
variable a user can override, and falls back to pip's own configuration when that index is unreachable."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _make_plan(path_env, *overrides):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), ".venv/.installed", *overrides],
                         env={**os.environ, "PATH": path_env}, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "install-torch.sh" in line]


def _no_gpu_path(tmp_path):
    """PATH without any nvidia-smi (keeps make and sh)."""
    return ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())


def test_no_gpu_picks_the_cpu_wheel_index(tmp_path):
    assert _make_plan(_no_gpu_path(tmp_path)) == [f'sh scripts/install-torch.sh .venv/bin/python 2.13.0 "{CPU_INDEX}"']


def test_a_gpu_machine_uses_pips_own_configuration(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvidia-smi").chmod(0o755)
    assert _make_plan(f"{fake}:{_no_gpu_path(tmp_path)}") == ['sh scripts/install-torch.sh .venv/bin/python 2.13.0 ""']


def test_the_index_is_a_variable_a_user_can_override(tmp_path):
    plan = _make_plan(_no_gpu_path(tmp_path), "TORCH_INDEX=https://example.org/whl/cu126")
    assert plan == ['sh scripts/install-torch.sh .venv/bin/python 2.13.0 "https://example.org/whl/cu126"']
    assert _make_plan(_no_gpu_path(tmp_path), "TORCH_INDEX=") == ['sh scripts/install-torch.sh .venv/bin/python 2.13.0 ""']


def _fake_python(tmp_path, index_works: bool) -> tuple[Path, Path]:
    log = tmp_path / "pip-calls.txt"
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\n"
                  f'echo "$@" >> {log}\n'
                  + ("" if index_works else 'case "$*" in *--index-url*) exit 1;; esac\n')
                  + "exit 0\n")
    py.chmod(0o755)
    return py, log


@pytest.mark.parametrize("index_works", [True, False])
def test_install_script_tries_the_index_quickly_then_falls_back(tmp_path, index_works):
    py, log = _fake_python(tmp_path, index_works)
    out = subprocess.run(["sh", str(ROOT / "scripts" / "install-torch.sh"), str(py), "2.13.0", CPU_INDEX],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    first = f"-m pip install --quiet --timeout 5 --retries 0 --index-url {CPU_INDEX} torch==2.13.0"
    if index_works:
        assert calls == [first]
    else:
        assert calls == [first, "-m pip install --quiet torch==2.13.0"]
        assert "falling back to pip's own configuration" in out.stdout


def test_install_script_without_an_index_uses_pips_configuration(tmp_path):
    py, log = _fake_python(tmp_path, True)
    subprocess.run(["sh", str(ROOT / "scripts" / "install-torch.sh"), str(py), "2.13.0", ""], check=True,
                   capture_output=True, timeout=60)
    assert log.read_text().splitlines() == ["-m pip install --quiet torch==2.13.0"]
