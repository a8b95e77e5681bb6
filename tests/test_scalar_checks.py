"""Scalar argument checks go through ``attnkit._checks`` (issue 28 item 5): a module that spells the rule itself
(``isinstance(x, bool) or not isinstance(x, int) ...``) writes its own message and its own error type, and the
next such check drifts from the others. The scan finds each such spelling; the few left are listed with why."""

import ast
from pathlib import Path

import attnkit

SRC = Path(attnkit.__file__).parent

#: hand-written checks that stay, and why (module -> count)
LEFT = {
    "models/generation.py": 2,  # token ids inside prompts / stop_tokens: elements of a collection, not scalars
    "sweep/space.py": 1,  # a knob's value against the knob's own kind (int or float knob)
    "masks/dense.py": 1,  # an index that may be an int or a tensor
    "masks/picture.py": 1,  # masks/ lane
    "integrations/hf/folders.py": 2,  # a config.json's fields, checked as data (issue 28.2 rewrites this module)
    "runs/read.py": 2,  # a metrics.jsonl record's fields, checked as data
    "diagnostics/checks/base.py": 1,  # a check's order: any real number, NaN refused
    "diagnostics/report/__init__.py": 1,  # report lane
    "diagnostics/capture.py": 1,  # a layer index in [-size, size)
}


def hand_written(source: str) -> int:
    """How many ``isinstance(x, bool) or not isinstance(x, ...)`` spellings ``source`` holds."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) >= 2:
            first, second = node.values[0], node.values[1]
            if (isinstance(first, ast.Call) and ast.unparse(first.func) == "isinstance"
                    and ast.unparse(first.args[1]) == "bool" and isinstance(second, ast.UnaryOp)
                    and isinstance(second.op, ast.Not) and isinstance(second.operand, ast.Call)
                    and ast.unparse(second.operand.func) == "isinstance"):
                count += 1
    return count


def test_scalar_checks_go_through_the_helpers():
    found = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py")) if p.name != "_checks.py"
             for n in [hand_written(p.read_text())] if n}
    assert {k: v for k, v in found.items() if v > LEFT.get(k, 0)} == {}, (
        "check scalars with attnkit._checks (positive_int, integer, number): one message and one error type")


def test_the_scan_can_fail():
    assert hand_written("if isinstance(x, bool) or not isinstance(x, int) or x < 0:\n    raise E\n") == 1
    assert hand_written("integer(x, 'x', low=0, fix='')\n") == 0
