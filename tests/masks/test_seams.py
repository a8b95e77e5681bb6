"""The seams of ``masks/`` (issue 28 items 4 and 5).

- Backends, caches and integrations read a mask's structure from ``masks/`` (``prepared.structure``, a mask's
  ``kind``, ``leaves()``, ``conjuncts()``, ``offsets()``/``reach()``, ``is_plain_causal``), never by testing its
  class: no module outside ``masks/`` names a mask kind class (an import, an attribute, or the class name as a
  string). The algebra (``And``, ``Or``, ``Not``) and the base ``MaskSpec`` may be named: they build masks and
  type-check inputs, they say nothing about a kind.
- ``masks/`` has no import circle: its modules import each other in one direction (function-level imports
  included), so a kind can be read top to bottom.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import attnkit
from attnkit import masks

SRC = Path(attnkit.__file__).parent
MASKS = SRC / "masks"
ALGEBRA = {"MaskSpec", "Combination", "And", "Or", "Not"}


def _mask_modules():
    yield masks
    for info in pkgutil.walk_packages(masks.__path__, "attnkit.masks."):
        yield importlib.import_module(info.name)


def _kind_classes() -> set[str]:
    """The names of every mask kind class defined in ``attnkit.masks`` (MaskSpec subclasses, the algebra aside)."""
    found = set()
    for module in _mask_modules():
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, masks.MaskSpec) and value.__module__ == module.__name__:
                found.add(name)
    return found - ALGEBRA


KINDS = _kind_classes()


def _named_kinds(path: Path, kinds: set[str]) -> list[str]:
    """Where ``path`` names a kind class: imported from ``attnkit.masks...``, read as an attribute, or spelled as a
    string constant."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found, hints = [], _annotation_nodes(tree)  # a type hint names a class without testing anything
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnkit.masks"):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in kinds]
        elif isinstance(node, ast.Attribute) and node.attr in kinds:
            found.append(f"line {node.lineno}: reads .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds:
            found.append(f"line {node.lineno}: spells {node.value!r}")
    return found


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (arguments, returns, annotated assignments)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots.append(node.returns)
            args = node.args
            roots += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                      if a is not None]
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots if root is not None for n in ast.walk(root)}


def test_the_kinds_are_found():
    assert {"Causal", "SlidingWindow", "Padding", "Document", "Dense", "Custom"} <= KINDS
    assert not KINDS & ALGEBRA


OUTSIDE = sorted(p for p in SRC.rglob("*.py") if MASKS not in p.parents)


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_outside_masks_names_a_mask_kind(path):
    found = _named_kinds(path, KINDS)
    assert not found, (f"{path.relative_to(SRC)} names mask kind classes ({'; '.join(found)}); read the structure "
                       "from attnkit.masks instead: prepared.structure (kinds, offsets, reach, doc_ids, ...), "
                       "mask.kind, mask.leaves() / conjuncts(), masks.is_plain_causal(mask), or build masks with "
                       "the constructors (masks.dense(t), masks.causal(), ...).")


def test_the_kind_scan_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("from attnkit.masks import Causal, MaskSpec, And\nfrom attnkit import masks\n"
                    "def f(m) -> masks.Causal:\n    return isinstance(m, masks.Document) or type(m).__name__ == 'Padding'\n")
    assert _named_kinds(fake, KINDS) == ["line 1: imports Causal", "line 4: reads .Document", "line 4: spells 'Padding'"]


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (they never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            out |= {id(n) for n in ast.walk(node)}
    return out


def _imports_within(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports (module level and inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip, found = _type_checking_only(tree), set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from attnkit.masks import spec`
    return {name for name in found if name == package or name.startswith(package + ".")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _masks_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in MASKS.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        graph[name] = {m for m in _imports_within(path, "attnkit.masks") if m in files and m != name}
    return graph


def test_masks_has_no_import_circle():
    found = _cycle(_masks_graph())
    assert found is None, f"masks/ imports in a circle: {' -> '.join(found)}; import in one direction (the kinds " \
                          "below the prepared mask, the base and the algebra below the kinds)"


def test_the_circle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
