"""The README's Python blocks run as pasted."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, capsys):
    namespace: dict = {}
    for block in BLOCKS[: index + 1]:  # later blocks may use names from earlier ones
        exec(compile(block, f"README block {index}", "exec"), namespace)


def test_drop_in_example_prints_true(capsys):
    namespace: dict = {}
    block = next(b for b in BLOCKS if "from_torch" in b)
    exec(block, namespace)
    assert capsys.readouterr().out.strip().endswith("True")
