"""Every Python block of README.md and docs/*.md runs as pasted, on its own, from a temporary folder, and leaves
nothing in the repository (issue 23, item 6).

Two markers, an HTML comment on the line before the fence (invisible on GitHub):

- ``<!-- continues -->``: the block uses names from the block above; it runs chained after it (and after that
  one's own chain), in one namespace.
- ``<!-- skip: REASON -->``: the block is not run (REASON is required, e.g. "needs a GPU"); the test reports it
  as skipped with that reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the visible line above a fence whose block uses the names of the block above (an HTML comment was invisible)
CONTINUES = "*(continues the block above)*"
FENCE = re.compile(r"(?:(?:<!--\s*(?P<marker>skip:[^>]*?)\s*-->|(?P<continues>" + re.escape(CONTINUES) + r"))\n)?"
                   r"```python\n(?P<code>.*?)```", re.S)
#: folders the check for leftovers does not walk (the environment, git, caches written by imports)
NOT_WALKED = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis"}


@dataclass(frozen=True)
class Block:
    path: Path
    index: int  # 1-based, in the order of the file
    line: int  # the line of its ```python fence
    code: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.path.name}-{self.index}"


def parse(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, i, text[:m.start("code")].count("\n"), m.group("code"),
                  "continues" if m.group("continues") else m.group("marker"))
            for i, m in enumerate(FENCE.finditer(text), start=1)]


BLOCKS = [b for path in FILES for b in parse(path)]


def chain(block: Block) -> list[Block]:
    """The blocks that run for ``block``: itself, after the block above when it continues that one."""
    same = [b for b in BLOCKS if b.path == block.path]
    start = block.index
    while same[start - 1].marker == "continues":
        start -= 1
    return same[start - 1:block.index]


def repository_files() -> set[Path]:
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_WALKED]
        found.update(Path(folder, f).relative_to(ROOT) for f in files)
    return found


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_alone(block, tmp_path, monkeypatch):
    if block.marker and block.marker.startswith("skip:"):
        pytest.skip(f"{block.name} (line {block.line}): {block.marker[5:].strip()}")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    files_before = repository_files()  # just before: the window another test worker could write in stays small
    namespace: dict = {"__name__": "__docs__"}
    for b in chain(block):
        exec(compile("\n" * b.line + b.code, str(b.path), "exec"), namespace)  # tracebacks point at the .md line
    left = sorted(map(str, repository_files() - files_before))
    assert not left, f"{block.name} left files in the repository: {left}"


def test_every_python_fence_is_parsed_and_every_marker_is_valid():
    for path in FILES:
        text = path.read_text()
        blocks = parse(path)
        assert len(blocks) == text.count("```python\n"), f"{path.name}: a python fence the parser missed"
        for b in blocks:
            assert b.marker is None or b.marker == "continues" or b.marker[5:].strip(), \
                f"{b.name}: `<!-- skip: -->` needs a reason"
        assert not blocks or blocks[0].marker != "continues", f"{path.name}: the first block continues nothing"
        stray = re.findall(r"(?:<!--\s*skip:[^>]*-->|" + re.escape(CONTINUES) + r")\n(?!```python\n)", text)
        assert not stray, f"{path.name}: a marker not directly above a ```python fence: {stray}"
        hidden = re.findall(r"<!--\s*continue[sd]?\s*-->", text)
        assert not hidden, f"{path.name}: {hidden}: a reader can't see an HTML comment; write {CONTINUES} instead"


def test_chains_and_skips_are_recognised(tmp_path):
    (tmp_path / "x.md").write_text(f"```python\na = 1\n```\n{CONTINUES}\n```python\nb = a + 1\n```\n"
                                   f"{CONTINUES}\n```python\nassert b == 2\n```\n```python\nc = 3\n```\n"
                                   "<!-- skip: needs a GPU -->\n```python\nimport nothing_here\n```\n")
    blocks = parse(tmp_path / "x.md")
    assert [b.marker for b in blocks] == [None, "continues", "continues", None, "skip: needs a GPU"]
    assert [b.line for b in blocks] == [1, 5, 9, 12, 16]  # the fence lines
    global BLOCKS
    saved, BLOCKS = BLOCKS, blocks
    try:
        assert [b.index for b in chain(blocks[2])] == [1, 2, 3] and [b.index for b in chain(blocks[3])] == [4]
    finally:
        BLOCKS = saved


def test_drop_in_example_prints_true(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = next(b for b in BLOCKS if b.path.name == "README.md" and "from_torch" in b.code)
    for b in chain(block):
        exec(b.code, {})
    assert capsys.readouterr().out.strip().endswith("True")


def test_committed_pages_show_no_local_paths():
    """Issue 31 item 5: the example report page showed a developer's path (/work/wt/.../site-packages/...). The
    pages a reader opens (README, docs/, examples/) name files as a user would type them."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files", "README.md", "docs", "examples", "benchmarks/README.md"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    local = re.compile(r"(?<![\w.])/(?:work|home|root|Users|private/var)/[\w.+-]+|site-packages/|\.venv/lib/")
    found = [f"{name}: {m.group(0)}" for name in files if name.endswith((".md", ".html", ".ipynb", ".py"))
             for m in [local.search((ROOT / name).read_text(errors="replace"))] if m]
    assert found == []


def test_the_readme_benchmark_table_reads_in_ten_seconds():
    """Issue 31 item 6: one short line per result (what, ratio, baseline); the conditions, runs and targets of each
    go to benchmarks/README.md ("The README's results in full"), not into the README's cells."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Benchmarks\n"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what ")]
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3 and all(cells), f"a row is | what | result | baseline |: {row}"
        assert len(row) <= 120, (f"{len(row)} characters, at most 120: move the details to benchmarks/README.md "
                                 f"(The README's results in full): {row}")
    assert "## The README's results in full" in (ROOT / "benchmarks" / "README.md").read_text()
