"""The run: one home for everything that reads or writes a run folder, and for what a model target names.

- :mod:`~attnkit.runs.read`: the verified checkpoint reader, :func:`load_model`, ``metrics.jsonl``;
- :mod:`~attnkit.runs.tokens`: the byte tokenizer, a converted run's saved tokenizer;
- :mod:`~attnkit.runs.write`: atomic checkpoints (and restoring a trainer's optimizer and RNG state);
- :mod:`~attnkit.runs.folder`: the run folder's lock, set-aside and replace-only-after-success;
- :mod:`~attnkit.runs.convert`: a Hugging Face folder written as a run (``attnkit convert``);
- :mod:`~attnkit.runs.export`: a run written as a Hugging Face folder (``attnkit export``, :func:`export_run`);
- :mod:`~attnkit.runs.source`: :func:`open_source`, the one place a target string (preset, run, checkpoint,
  Hugging Face folder, ``hf-*-tiny``) becomes a model, its tokenizer, its metrics and its kind.

Nothing outside this package and the CLI reads or writes a run folder's files by name (``tests/test_layering.py``).
"""

from attnkit.runs.export import Export, export_run
from attnkit.runs.read import CheckpointError, list_checkpoints, load_model, read_metrics, read_state, resolve
from attnkit.runs.source import Source, Target, locate, open_source
from attnkit.runs.tokens import ByteTokenizer, TextTokenizer, run_tokenizer

__all__ = ["ByteTokenizer", "CheckpointError", "Export", "export_run",
           "Source", "Target", "TextTokenizer", "list_checkpoints", "load_model",
           "locate", "open_source", "read_metrics", "read_state", "resolve", "run_tokenizer"]
