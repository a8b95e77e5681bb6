"""``attnkit masks``: draw a mask expression, e.g. ``attnkit masks "causal() & sliding_window(3)" --size 8``."""

from __future__ import annotations

import ast

from attnkit import masks as M
from attnkit.errors import AttnkitValueError

BUILDERS = {"causal": M.causal, "sliding_window": M.sliding_window, "strided": M.strided,
            "global_tokens": M.global_tokens, "padding": M.padding, "document": M.document, "chunked": M.chunked}
EXAMPLES = ["causal()", "sliding_window(3)", "causal() & strided(3)", "(sliding_window(2) | global_tokens([0])) & causal()",
            "document([0, 0, 0, 1, 1, 2, 2, 2]) & causal()", "padding([5])", "chunked(3) & causal()",
            "sliding_window(2, 1)"]


def parse(expression: str) -> M.MaskSpec:
    """Evaluate a mask expression built only from mask builders, literals, ``&``, ``|`` and ``~``."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise AttnkitValueError(f"mask expression {expression!r} is not valid: {exc.msg}; "
                                f"write e.g. {EXAMPLES[2]!r}.") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            left, right = ev(node.left), ev(node.right)
            return left & right if isinstance(node.op, ast.BitAnd) else left | right
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return ~ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILDERS and not node.keywords:
            return BUILDERS[node.func.id](*[ast.literal_eval(a) for a in node.args])
        raise AttnkitValueError(f"mask expression {expression!r}: only {sorted(BUILDERS)} with literal arguments, "
                                "&, | and ~ are allowed.")

    return ev(tree)


def add_parser(sub) -> None:
    p = sub.add_parser("masks", help="draw masks as ASCII pictures (rows = queries, columns = keys)")
    p.add_argument("expression", nargs="*", help=f"mask expressions, e.g. {EXAMPLES[1]!r}; default: a gallery")
    p.add_argument("--size", type=int, default=None, help="sequence length to draw (default 8, or the data's length)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.size is not None and args.size < 1:
        raise AttnkitValueError(f"--size must be a length >= 1 (the rows and columns to draw), got {args.size}; e.g. "
                                "--size 8.")
    for expression in args.expression or EXAMPLES:
        mask = parse(expression)
        print(f"{mask!r}\n{mask.picture(args.size, args.size)}\n")
    return 0
