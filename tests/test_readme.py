"""The README's and the docs' Python blocks run as pasted (each file's blocks in order, one namespace)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(path, i, block) for path in FILES
          for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))]


@pytest.mark.parametrize(("path", "index"), [(p, i) for p, i, _ in BLOCKS],
                         ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_block_runs(path, index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {}
    for p, i, block in BLOCKS:
        if p == path and i <= index:  # later blocks may use names from earlier ones
            exec(compile(block, f"{path.name} block {i}", "exec"), namespace)


def test_drop_in_example_prints_true(capsys):
    namespace: dict = {}
    block = next(b for p, _, b in BLOCKS if p.name == "README.md" and "from_torch" in b)
    exec(block, namespace)
    assert capsys.readouterr().out.strip().endswith("True")
