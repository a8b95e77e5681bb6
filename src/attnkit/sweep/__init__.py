"""``attnkit sweep``: the tutorial's procedure as a command. First the standard configuration as the baseline, then a
small search around it on Optuna (TPE sampler, median pruner), then the verdict decided by the measured validation
loss of the best and the baseline re-run with new seeds.

>>> from attnkit.sweep import SweepConfig, run_sweep
>>> summary = run_sweep(SweepConfig(run_dir="runs/sweep", preset="tiny", minutes=10))   # doctest: +SKIP
>>> summary["verdict"]["words"]                                                         # doctest: +SKIP

Parts: the search space and its knobs (:mod:`~attnkit.sweep.space`), the settings, baseline and plan
(:mod:`~attnkit.sweep.config`), the study and its storage (:mod:`~attnkit.sweep.study`,
:mod:`~attnkit.sweep.storage`), one trial (:mod:`~attnkit.sweep.trial`), the workers (:mod:`~attnkit.sweep.worker`,
:mod:`~attnkit.sweep.parallel`), the time budget (:mod:`~attnkit.sweep.budget`), the verdict
(:mod:`~attnkit.sweep.verdict`) and the summary (:mod:`~attnkit.sweep.summary`, :mod:`~attnkit.sweep.figure`).
See docs/sweep.md.
"""

from attnkit.sweep.config import SweepConfig
from attnkit.sweep.run import SweepInterrupted, join_sweep, resume_sweep, run_sweep
from attnkit.sweep.space import KNOBS, Choices, Range, default_space, parse_words, read_toml

__all__ = ["KNOBS", "Choices", "Range", "SweepConfig", "SweepInterrupted", "default_space", "join_sweep",
           "parse_words", "read_toml", "resume_sweep", "run_sweep"]
