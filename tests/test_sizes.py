"""Issue 20's size rule: every module of src/attnkit fits in ~400 lines and every function in ~60 (its docstring
not counted: an argument list written out is documentation, not complexity)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end of the body, less the docstring's."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def oversized(root: Path = SRC) -> list[str]:
    """``'path: N lines'`` and ``'path:line name: N lines'`` for each module and function over the rule."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        if len(text.splitlines()) > MAX_FILE_LINES:
            found.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _function_lines(node) > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name}: {_function_lines(node)} lines")
    return found


def test_no_module_or_function_over_the_size_rule():
    assert oversized() == []


def test_the_rule_sees_a_long_module_and_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long_function.py").write_text(f'def f():\n    """doc\n    more doc"""\n{body}\n')
    (tmp_path / "long_module.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (tmp_path / "fits.py").write_text(f'def g():\n    """doc"""\n{body[: body.rindex(chr(10))]}\n')
    assert oversized(tmp_path) == [f"{tmp_path.name}/long_function.py:1 f: {MAX_FUNCTION_LINES + 1} lines",
                                   f"{tmp_path.name}/long_module.py: {MAX_FILE_LINES + 1} lines"]
