"""Labs: the tutorial's claims about self-attention as small, seeded experiments with honest verdicts.

>>> from attnkit.labs import run_lab
>>> payload = run_lab("scale", quick=True, out="runs/labs/scale")     # doctest: +SKIP
>>> [v["verdict"] for v in payload["verdicts"]]                        # doctest: +SKIP

``attnkit lab NAME [--quick] [--out DIR]`` runs one from the command line; ``attnkit lab all --quick`` runs
every lab at CI size. See docs/labs.md for the committed full runs and what they mean.
"""

# importing a lab registers it; `attnkit lab all` runs them in this order
from attnkit.labs import (
    efficient,  # noqa: E402,F401
    heads,  # noqa: E402,F401
    long_range,  # noqa: E402,F401
    mask,  # noqa: E402,F401
    pitfalls,  # noqa: E402,F401
    positions,  # noqa: E402,F401
    scale,  # noqa: E402,F401,I001
)
from attnkit.labs.registry import LABS, Lab, get_lab, lab, run_lab

__all__ = ["LABS", "Lab", "get_lab", "lab", "run_lab"]
