"""``attnkit masks``: draw a mask expression, e.g. ``attnkit masks "causal() & sliding_window(3)" --size 8``.

``padding`` takes what a user types: ``padding(5)`` or ``padding([5])`` is one row of 5 real tokens (then padding),
``padding([1, 1, 1, 0])`` one row of 0/1 flags (1 = real token), ``padding([[1, 1, 0], [1, 0, 0]])`` rows of them.
"""

from __future__ import annotations

import ast

import torch

from attnkit import masks as M
from attnkit.errors import AttnkitValueError

BUILDERS = {"causal": M.causal, "sliding_window": M.sliding_window, "strided": M.strided,
            "global_tokens": M.global_tokens, "padding": M.padding, "document": M.document, "chunked": M.chunked}
EXAMPLES = ["causal()", "sliding_window(3)", "causal() & strided(3)", "(sliding_window(2) | global_tokens([0])) & causal()",
            "document([0, 0, 0, 1, 1, 2, 2, 2]) & causal()", "padding([5])", "chunked(3) & causal()",
            "sliding_window(2, 1)", "padding([1, 1, 1, 0, 0])"]
#: the largest picture size: a picture shows at most the top-left 32 x 32, but the mask is built L x L first
MAX_SIZE = 4096


def padding(arg) -> M.Padding:
    """``padding`` as the command line reads it (see the module docstring): a length, or 0/1 flags per key."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        arg = [arg]
    rows = arg if isinstance(arg, list) and arg and all(isinstance(r, list) for r in arg) else None
    if isinstance(arg, list) and len(arg) == 1 and not isinstance(arg[0], (list, bool)):
        return M.padding(arg)  # one row's length
    flags = rows if rows is not None else [arg] if isinstance(arg, list) else None
    if (flags is None or not all(len(r) == len(flags[0]) and r for r in flags)
            or not all(v in (0, 1) and not isinstance(v, float) for r in flags for v in r)):
        raise AttnkitValueError(f"padding({arg!r}): pass one length (padding(5) or padding([5])), a row of 0/1 flags "
                                "with 1 = real token (padding([1, 1, 1, 0])), or rows of them of one length "
                                "(padding([[1, 1, 0], [1, 0, 0]])); the picture shows the first row.")
    return M.padding(torch.tensor(flags, dtype=torch.bool))  # (B, Lk), True = real token


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
            args = [ast.literal_eval(a) for a in node.args]
            if node.func.id == "padding" and len(args) == 1:
                return padding(args[0])
            return BUILDERS[node.func.id](*args)
        raise AttnkitValueError(f"mask expression {expression!r}: only {sorted(BUILDERS)} with literal arguments, "
                                "&, | and ~ are allowed.")

    return ev(tree)


def add_parser(sub) -> None:
    p = sub.add_parser("masks", help="draw masks as ASCII pictures (rows = queries, columns = keys)")
    p.add_argument("expression", nargs="*", help=f"mask expressions, e.g. {EXAMPLES[1]!r}; default: a gallery")
    p.add_argument("--size", type=int, default=None,
                   help=f"sequence length, 1 to {MAX_SIZE} (default 8, or the data's length); the picture shows at "
                        "most its top-left 32 x 32")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.size is not None and args.size < 1:
        raise AttnkitValueError(f"--size must be a length >= 1 (the rows and columns to draw), got {args.size}; e.g. "
                                "--size 8.")
    if args.size is not None and args.size > MAX_SIZE:
        raise AttnkitValueError(f"--size must be at most {MAX_SIZE} (the mask is built L x L before its top-left 32 x 32 "
                                f"is drawn), got {args.size}; e.g. --size 8.")
    masks = [(expression, parse(expression)) for expression in args.expression or EXAMPLES]  # all before drawing
    for expression, mask in masks:
        size = args.size or mask.natural_length() or 8
        if size > MAX_SIZE:
            raise AttnkitValueError(f"mask expression {expression!r} has data {size} keys long, more than the "
                                    f"{MAX_SIZE} drawn at most; pass --size {MAX_SIZE} or less, or shorter data.")
    for _, mask in masks:
        print(f"{mask!r}\n{mask.picture(args.size, args.size)}\n")
    return 0
