"""The tokenizer a converted run carries (``attnkit convert`` saves it as ``RUN_DIR/tokenizer/``).

Kept outside ``attnkit.integrations.hf`` so asking costs nothing: transformers is imported only when a run has one.
"""

from __future__ import annotations

from pathlib import Path

TOKENIZER_DIR = "tokenizer"


def run_tokenizer(path: str | Path):
    """The saved tokenizer of the run at ``path`` (the run folder or one of its checkpoints) as a
    :class:`~attnkit.integrations.hf.folders.TextTokenizer` (``encode``, ``decode``, ``EOS``, ``.hf``), or None
    when the run has none (a run the trainer wrote: bytes)."""
    path = Path(path)
    for folder in (path, path.parent.parent):
        if (folder / TOKENIZER_DIR / "tokenizer_config.json").is_file():
            from attnkit.integrations.hf.folders import TextTokenizer

            return TextTokenizer.load(folder / TOKENIZER_DIR)
    return None
