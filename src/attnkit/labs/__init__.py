"""Labs: the tutorial's claims about self-attention as small, seeded experiments with honest verdicts.

>>> from attnkit.labs import run_lab
>>> payload = run_lab("scale", quick=True, out="runs/labs/scale")     # doctest: +SKIP
>>> [v["verdict"] for v in payload["verdicts"]]                        # doctest: +SKIP

``attnkit lab NAME [--quick] [--out DIR]`` runs one from the command line; ``attnkit lab all --quick`` runs
every lab at CI size. See docs/labs.md for the committed full runs and what they mean.
"""

import importlib
import pkgutil

from attnkit.labs.registry import LABS, Lab, get_lab, lab, run_lab

# every module of this package is imported, and each @lab in it registers itself: adding a lab is adding a file;
# `attnkit lab all` runs them in module-name order
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["LABS", "Lab", "get_lab", "lab", "run_lab"]
