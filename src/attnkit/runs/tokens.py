"""The tokens of a run: bytes for a run the trainer wrote, the model's own tokenizer for a converted one.

``attnkit convert`` saves the Hugging Face tokenizer as ``RUN_DIR/tokenizer/`` (:mod:`attnkit.runs.convert`);
:func:`run_tokenizer` finds it again, so ``attnkit generate`` and the report speak the model's tokens instead of
bytes. transformers is imported only when a run has a saved tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOKENIZER_DIR = "tokenizer"


class ByteTokenizer:
    """The tokens of a run the trainer wrote: UTF-8 bytes (0..255) plus ``EOS = 256``; ``vocab_size = 257``.
    (A converted run carries its own tokenizer: :func:`run_tokenizer`.)"""

    EOS = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


@dataclass
class TextTokenizer:
    """A Hugging Face tokenizer with the interface ``attnkit generate`` uses (``encode``, ``decode``, ``EOS``)."""

    hf: object

    @property
    def EOS(self) -> int | None:  # noqa: N802  (ByteTokenizer's name)
        return self.hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    @classmethod
    def load(cls, folder: str | Path) -> TextTokenizer | None:
        """The tokenizer saved in ``folder`` (None when it has none), through the one guarded reader
        (:func:`attnkit.integrations.hf.folders.load_tokenizer`: a tokenizer asking for the folder's code is refused)."""
        from attnkit.integrations.hf.folders import load_tokenizer

        hf = load_tokenizer(folder)
        return None if hf is None else cls(hf)


def folder_tokenizer(path: str | Path) -> TextTokenizer | None:
    """The tokenizer of a Hugging Face folder, or None when it has none (weights but no tokenizer files)."""
    return TextTokenizer.load(path)


def run_tokenizer(path: str | Path) -> TextTokenizer | None:
    """The saved tokenizer of the run at ``path`` (the run folder or one of its checkpoints), or None when the
    run has none (a run the trainer wrote: bytes)."""
    path = Path(path)
    for folder in (path, path.parent.parent):
        if (folder / TOKENIZER_DIR / "tokenizer_config.json").is_file():
            return TextTokenizer.load(folder / TOKENIZER_DIR)
    return None
