"""Layering you can test: a module imports only its own level or below (docs/architecture.md draws them).

Every ``import`` in ``src/attnkit`` (module level and inside functions) is read with ``ast``; the importing and
the imported module are mapped to their top-level part (``attnkit.backends.sdpa`` -> ``backends``), and a part
may import a part of its own level or a lower one. A new top-level part must be given a level here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import attnkit

SRC = Path(attnkit.__file__).parent

#: level of each top-level part of the package; imports go to the same level or lower, never up
LEVELS = {
    "errors": 0, "_checks": 0, "_hooks": 0, "_bias": 0, "_timing": 0, "_progress": 0, "_files": 0, "_tolerance": 0, "_memo": 0,
    "masks": 1, "positions": 1, "functional": 1, "_validation": 1,
    "backends": 2, "cache": 2,
    "nn": 3,
    "models": 4, "integrations": 4, "distributed": 4,
    "runs": 5, "training": 5,
    "diagnostics": 6, "sweep": 6,
    "bench": 7, "labs": 7,
    "cli": 8, "__main__": 8, "__init__": 8,
}

#: the package root (``import attnkit``) re-exports parts up to the diagnostics: only this level and above may use it
ROOT_MIN_LEVEL = 6

#: same- or lower-level imports the design still forbids: (importer prefix, imported prefix, why)
FORBIDDEN = [
    ("attnkit.training", "attnkit.bench", "the trainer must not depend on the benchmarks (shared timing: attnkit._timing)"),
    ("attnkit.diagnostics", "attnkit.training",
     "the doctor and the report read run folders without the trainer (verified checkpoints, the tokenizers and "
     "metrics.jsonl: attnkit.runs)"),
    ("attnkit.runs", "attnkit.training", "the run folder is the trainer's storage, not the other way round: the trainer "
                                         "writes through attnkit.runs, which knows nothing of training"),
]

#: the file names of a run folder: only ``runs/`` (which defines them) and ``cli/`` spell them out
RUN_FILE_NAMES = {"metrics.jsonl", "state.json", "model.safetensors", "optim.safetensors", "loss.png", ".attnkit.lock",
                  ".replaced", "checkpoints", "tokenizer"}
RUN_FILE_OWNERS = ("runs", "cli")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    return ".".join(rel.parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "attnkit":  # `from attnkit import backends` names the parts themselves
                found += [(node.lineno, f"attnkit.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
    return [(line, name) for line, name in found if name == "attnkit" or name.startswith("attnkit.")]


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1].removesuffix("/__init__")


FILES = sorted(SRC.rglob("*.py"))


def test_every_part_has_a_level():
    parts = {_part(_module_name(f)) for f in FILES}
    missing = sorted(parts - LEVELS.keys())
    assert not missing, f"give these top-level parts a level in tests/test_layering.py LEVELS: {missing}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_down(path):
    importer = _module_name(path)
    mine = LEVELS.get(_part(importer))
    upward = []
    for line, name in _imports(path):
        theirs = LEVELS.get(_part(name))
        if name == "attnkit":  # the root facade re-exports the diagnostics: only their level and above use it
            if mine is not None and mine < ROOT_MIN_LEVEL:
                upward.append(f"line {line}: imports the package root 'attnkit' from level {mine}; import the part")
        elif mine is not None and theirs is not None and theirs > mine:
            upward.append(f"line {line}: {name} (level {theirs}) from level {mine}")
        for src, dst, why in FORBIDDEN:
            if importer.startswith(src) and name.startswith(dst):
                upward.append(f"line {line}: {name}: {why}")
    assert not upward, f"{importer} imports upward:\n  " + "\n  ".join(upward) + (
        "\nMove the shared code down a level (or pass it in: e.g. the CLI hands the trainer a monitor callback).")


def _strings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of the string constants in ``path`` (f-strings' literal parts too), docstrings aside."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


def _run_file_names(path: Path) -> list[tuple[int, str]]:
    """String constants in ``path`` (docstrings aside) that are exactly a run folder's file name."""
    return [(line, text) for line, text in _strings(path) if text in RUN_FILE_NAMES]


def _flag_names(path: Path) -> list[tuple[int, str]]:
    """String constants in ``path`` (docstrings and comments aside) that begin with a command-line flag."""
    return [(line, text) for line, text in _strings(path)
            if re.match(r"--[A-Za-z][A-Za-z-]", text)]  # a flag's name is 2+ letters: "--s" is a matplotlib style


def test_the_flag_check_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text('"""--run-dir in a docstring is fine."""\n# --out in a comment too\nA = "--"\n'
                    'B = f"--device {A}: no"\nC = "pass --overwrite"\nS = "--s"\n')
    assert _flag_names(fake) == [(4, "--device ")]


#: strings only some parts may spell: {what: (finder, the parts that may, the fix)}. Issue 20 item 4: the library
#: names its Python arguments (``run_dir=``) and cli/flags.py translates them to flags
OWNED_STRINGS = {
    "a run folder's files": (_run_file_names, RUN_FILE_OWNERS, "read and write run folders through attnkit.runs "
                                                               "(its constants, its reader and writers)"),
    "command-line flags": (_flag_names, ("cli", "bench"), "name the Python argument (run_dir=, overwrite=True) and "
                                                          "let attnkit.cli.flags translate it"),
}


@pytest.mark.parametrize("what, path", [(what, f) for what, (_, owners, _) in OWNED_STRINGS.items()
                                        for f in FILES if _part(_module_name(f)) not in owners],
                         ids=lambda v: str(v.relative_to(SRC)) if isinstance(v, Path) else v.replace(" ", "-"))
def test_only_the_owners_spell_their_strings(what, path):
    find, _, fix = OWNED_STRINGS[what]
    found = find(path)
    assert not found, f"{_module_name(path)} names {what} itself: {found}; {fix}"


def test_the_file_name_check_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text('"""metrics.jsonl in a docstring is fine."""\nPATH = "metrics.jsonl"\n')
    assert _run_file_names(fake) == [(2, "metrics.jsonl")]


def test_the_reader_sees_every_import_form(tmp_path, monkeypatch):
    # the checker itself can fail: absolute, relative, `from attnkit import part` and in-function imports
    fake = tmp_path / "attnkit" / "training" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("import attnkit.bench.common\nfrom ..diagnostics import doctor\nfrom attnkit import labs\n"
                    "def f():\n    from attnkit.cli import main\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "attnkit")
    names = [name for _, name in _imports(fake)]
    assert names == ["attnkit.bench.common", "attnkit.diagnostics", "attnkit.labs", "attnkit.cli"]
    assert all(LEVELS[_part(n)] > LEVELS["training"] for n in names)


def test_a_forbidden_pair_is_caught(tmp_path, monkeypatch):
    # the FORBIDDEN rules can fail: a diagnostics module loading a run through the trainer is reported
    fake = tmp_path / "attnkit" / "diagnostics" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def load(path):\n    from attnkit.training.loop import load_model\n    return load_model(path)\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "attnkit")
    with pytest.raises(AssertionError, match=r"line 2: attnkit.training.loop: the doctor and the report read run "
                                             r"folders without the trainer"):
        test_imports_go_down(fake)


def test_nothing_cites_a_design_file_the_repository_does_not_have():
    """issue 20 item 5: source, tests and docs cited a DESIGN.md that is not in the repository; the rules live in
    docs/conventions.md and docs/architecture.md."""
    root = SRC.parents[1]
    if not (root / "docs").is_dir():
        pytest.skip("not a source checkout (no docs/ next to src/)")
    paths = [*SRC.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "docs").rglob("*.md"), root / "README.md"]
    citing = sorted(str(p.relative_to(root)) for p in paths if "DESIGN" in p.read_text(errors="replace")
                    and p != Path(__file__).resolve() and not (root / "DESIGN.md").exists())
    assert not citing, f"these cite DESIGN.md, which is not in the repository: {citing}; cite docs/conventions.md"
