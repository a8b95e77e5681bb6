#!/usr/bin/env python
"""Rename LMConfig's fields to the glossary's names (issue 20 item 5), idempotently, on any checkout.

    dim -> embed_dim (E)    n_layers -> num_layers    n_heads -> num_heads (H)    n_kv_heads -> num_kv_heads (Hkv)

Usage (from the repository root; rerunning it is a no-op)::

    python scripts/rename_lmconfig.py            # rewrite src/ tests/ examples/ benchmarks/ scripts/ docs/ README.md
    python scripts/rename_lmconfig.py --check    # list the files it would change; exit 1 if any

What it touches, and nothing else (``dim`` is everywhere in torch code, so it is renamed only where it is
certainly LMConfig's):

Python (located with ``ast``, positions checked against the text before each edit):
 - attribute accesses ``.n_layers`` / ``.n_heads`` / ``.n_kv_heads`` (no other attnkit object has them), and
   ``.dim`` only on a config: ``config.dim``, ``cfg.dim``, ``x.config.dim``, ``lm_config(...).dim``,
   ``self.dim`` inside ``class LMConfig``; never a call (``x.dim()``) and never ``args.dim`` (CLI flags keep their spelling);
 - keyword arguments of the calls that build an LMConfig (:data:`CONFIG_CALLS`: ``LMConfig(dim=...)``,
   ``build_lm("nano", n_heads=4)``, ``tiny_lm(...)``, ``.replace(...)``); a renamed keyword to any other call is
   reported (not changed) so a new forwarding helper can be added to :data:`CONFIG_CALLS`;
 - the field declarations in ``class LMConfig``;
 - the string ``"dim"`` when it names the field: a key of a dict display whose keys are all LMConfig fields
   (``{"dim": 64, "n_layers": 2}``), an element of a tuple/list/set of field names, or ``PRESETS[...]["dim"]``;
 - inside string literals (the literal parts of f-strings only) and comments: the words ``n_layers``,
   ``n_heads``, ``n_kv_heads`` (field names in messages, tuples of names, docstrings) and ``dim`` (E) in
   docstrings.

Markdown (README.md, docs/, benchmarks/, examples/): the words ``n_layers`` / ``n_heads`` / ``n_kv_heads`` and
``dim=`` inside a call of :data:`CONFIG_CALLS`.

Not touched: JSON files (tests/models/data keeps old-format fixtures on purpose: they must still load), local
variables and parameters named ``n_heads`` etc. (not LMConfig fields), and any line containing the marker
``rename-lmconfig: skip`` (the compatibility table in models/config.py and the old-format tests).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

RENAMES = {"dim": "embed_dim", "n_layers": "num_layers", "n_heads": "num_heads", "n_kv_heads": "num_kv_heads"}
WORDS = {old: new for old, new in RENAMES.items() if old != "dim"}  # unambiguous as words
#: the calls whose keyword arguments are LMConfig fields (they build one, or forward **overrides to one)
CONFIG_CALLS = {"LMConfig", "lm_config", "build_lm", "build_encoder", "tiny_lm", "replace", "_model"}
#: names under which code holds an LMConfig (``.dim`` on them is the field)
CONFIG_NAMES = {"config", "cfg", "lm_config", "model_config"}
#: every LMConfig field name, old and new (a dict or tuple made only of these names is about LMConfig)
FIELD_NAMES = set(RENAMES) | set(RENAMES.values()) | {
    "vocab_size", "mlp_ratio", "max_seq_len", "positions", "window", "causal", "backend", "dropout", "bias",
    "tie_embeddings", "init_std", "attention", "head_dim", "mlp_hidden", "norm", "norm_eps", "mlp", "post_norm",
    "qkv_bias", "qk_norm", "rope_base", "rope_scaling", "rope_style", "type_vocab_size", "embed_norm"}
SKIP = "rename-lmconfig: skip"
ROOTS = ("src", "tests", "examples", "benchmarks", "scripts", "docs", "README.md")
WORD_RE = re.compile(r"\b(" + "|".join(WORDS) + r")\b")
DIM_DOC_RE = re.compile(r"``dim`` \(E\)")
MD_CALL_RE = re.compile(r"\b(" + "|".join(sorted(CONFIG_CALLS)) + r")\(([^()]*)\)")
MD_DIM_RE = re.compile(r"(?<![\w.])dim=(?!=)")


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_config(node: ast.expr, in_lmconfig: bool) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES or (in_lmconfig and node.id == "self")
    if isinstance(node, ast.Call):
        return _callee(node) in ("LMConfig", "lm_config", "from_dict", "replace")
    return isinstance(node, ast.Attribute) and node.attr in ("config", "cfg")


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Finder(ast.NodeVisitor):
    """Collects (line, start byte, end byte, old, new) of every LMConfig name in a module."""

    def __init__(self, path: Path):
        self.path, self.edits, self.notes, self.in_lmconfig, self.calls = path, [], [], False, set()

    def _add(self, lineno, end_col, old, new, start_col=None):
        start = end_col - len(old) if start_col is None else start_col
        self.edits.append((lineno, start, start + len(old), old, new))

    def visit_ClassDef(self, node):
        outer, self.in_lmconfig = self.in_lmconfig, node.name == "LMConfig"
        if self.in_lmconfig:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in RENAMES:
                    t = stmt.target
                    self._add(t.lineno, t.end_col_offset, t.id, RENAMES[t.id])
        self.generic_visit(node)
        self.in_lmconfig = outer

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute):
            self.calls.add(id(node.func))  # x.dim() is a method call, never the field
        name = _callee(node)
        for kw in node.keywords:
            if kw.arg in RENAMES:
                if name in CONFIG_CALLS:
                    self._add(kw.lineno, None, kw.arg, RENAMES[kw.arg], start_col=kw.col_offset)
                elif kw.arg != "dim":
                    self.notes.append(f"{self.path}:{kw.lineno}: {kw.arg}= to {name}() left alone (not in "
                                      "CONFIG_CALLS; add the callee there if it builds an LMConfig)")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if id(node) not in self.calls and (node.attr in WORDS or (
                node.attr == "dim" and _is_config(node.value, self.in_lmconfig))):
            self._add(node.end_lineno, node.end_col_offset, node.attr, RENAMES[node.attr])
        self.generic_visit(node)

    def _dim_strings(self, nodes):
        names = [_str(n) for n in nodes]
        if "dim" in names and all(s in FIELD_NAMES for s in names if s is not None) and \
                sum(s is not None for s in names) >= 2:
            for n in nodes:
                if _str(n) == "dim":
                    self._add(n.lineno, n.col_offset + 1 + len("dim"), "dim", "embed_dim", start_col=n.col_offset + 1)

    def visit_Dict(self, node):
        if all(_str(k) is not None for k in node.keys):
            self._dim_strings(node.keys)
        self.generic_visit(node)

    def visit_Tuple(self, node):
        self._dim_strings(node.elts)
        self.generic_visit(node)

    visit_List = visit_Set = visit_Tuple

    def visit_Subscript(self, node):
        s = node.slice
        if _str(s) == "dim" and _root_name(node.value) == "PRESETS":
            self._add(s.lineno, s.col_offset + 1 + len("dim"), "dim", "embed_dim", start_col=s.col_offset + 1)
        self.generic_visit(node)


def _apply(text: str, edits, path: Path, notes: list[str]) -> str:
    lines = text.splitlines(keepends=True)
    for lineno, start, end, old, new in sorted(set(edits), reverse=True):
        raw = lines[lineno - 1].encode()  # ast columns are UTF-8 byte offsets
        if SKIP in lines[lineno - 1]:
            continue
        if raw[start:end] != old.encode():
            notes.append(f"{path}:{lineno}: expected {old!r} at byte {start}, found {raw[start:end]!r}; left alone")
            continue
        lines[lineno - 1] = (raw[:start] + new.encode() + raw[end:]).decode()
    return "".join(lines)


def _literal_parts(token: str) -> list[tuple[str, bool]]:
    """``token`` (a string literal) cut into (piece, is_literal_text); an f-string's ``{...}`` are code."""
    prefix = re.match(r"[A-Za-z]*", token).group(0)
    if "f" not in prefix.lower():
        return [(token, True)]
    parts, depth, start, i = [], 0, 0, 0
    while i < len(token):
        c = token[i]
        if depth == 0 and token.startswith(("{{", "}}"), i):
            i += 2
            continue
        if c == "{":
            if depth == 0:
                parts.append((token[start:i], True))
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                parts.append((token[start:i + 1], False))
                start = i + 1
        i += 1
    return parts + [(token[start:], True)]


def _words(text: str) -> str:
    return DIM_DOC_RE.sub("``embed_dim`` (E)", WORD_RE.sub(lambda m: WORDS[m.group(1)], text))


def _rewrite_tokens(text: str) -> str:
    """Rename the field words inside string literals (not f-string code) and comments."""
    lines = text.splitlines(keepends=True)
    edits = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT) or not WORD_RE.search(tok.string) and \
                not DIM_DOC_RE.search(tok.string):
            continue
        if any(SKIP in lines[n - 1] for n in range(tok.start[0], tok.end[0] + 1)):
            continue
        new = "".join(_words(p) if literal else p for p, literal in _literal_parts(tok.string))
        if new != tok.string:
            edits.append((tok.start, tok.end, new))
    for (sl, sc), (el, ec), new in reversed(edits):  # tokenize columns are characters
        head, tail = lines[sl - 1][:sc], lines[el - 1][ec:]
        lines[sl - 1:el] = [head + new + tail]
    return "".join(lines)


def rename_python(text: str, path: Path, notes: list[str]) -> str:
    finder = _Finder(path)
    finder.visit(ast.parse(text))
    notes.extend(finder.notes)
    return _rewrite_tokens(_apply(text, finder.edits, path, notes))


def rename_markdown(text: str) -> str:
    def call(m):
        return m.group(1) + "(" + MD_DIM_RE.sub("embed_dim=", m.group(2)) + ")"

    return "".join(line if SKIP in line else MD_CALL_RE.sub(call, WORD_RE.sub(lambda m: WORDS[m.group(1)], line))
                   for line in text.splitlines(keepends=True))


def files(root: Path):
    me = Path(__file__).resolve()
    for name in ROOTS:
        base = root / name
        for path in sorted([base] if base.is_file() else base.rglob("*") if base.is_dir() else []):
            if path.suffix in (".py", ".md") and path.resolve() != me and ".venv" not in path.parts:
                yield path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="repository root (default: the current folder)")
    ap.add_argument("--check", action="store_true", help="change nothing; list the files that would change")
    args = ap.parse_args(argv)
    notes, changed = [], []
    for path in files(Path(args.root)):
        text = path.read_text(encoding="utf-8")
        try:
            new = rename_python(text, path, notes) if path.suffix == ".py" else rename_markdown(text)
        except SyntaxError as exc:  # e.g. conflict markers: fix the file, then rerun
            notes.append(f"{path}: not Python ({exc.msg}, line {exc.lineno}); left alone, fix it and rerun")
            continue
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for line in notes:
        print("note:", line, file=sys.stderr)
    print(("would change" if args.check else "changed") + f" {len(changed)} files", *changed, sep="\n  ")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
