"""Hugging Face folders: loading one safely, and the tokenizer that travels with a converted run.

``attnkit convert --hf PATH --out RUN_DIR`` (:mod:`attnkit.cli.convert`) writes the run the trainer would
(``RUN_DIR/checkpoints/step_00000000/``), and the model's own tokenizer next to it (``RUN_DIR/tokenizer/``, by
``AutoTokenizer.save_pretrained``, :func:`save_tokenizer`); :func:`attnkit.integrations.runs.run_tokenizer` finds it again, so
``attnkit generate`` and the report speak the model's tokens instead of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.errors import AttnkitValueError
from attnkit.integrations.remote_code import read_config
from attnkit.integrations.runs import TOKENIZER_DIR  # noqa: F401  (re-exported)


def load_hf(path: str | Path, *, dtype: torch.dtype = torch.float32):
    """The transformers model of the local folder ``path`` (``*ForCausalLM`` for decoders, ``AutoModel`` for
    encoders), weights included; never runs code from the folder."""
    from attnkit.integrations.hf._deps import transformers
    from attnkit.integrations.hf.convert import family_of

    tf = transformers()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise AttnkitValueError(f"--hf {str(path)!r} is not a Hugging Face model folder (no config.json); pass the "
                                "folder that holds config.json and the weights.")
    read_config(folder)  # refuses auto_map (custom code) first
    config = tf.AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    family = family_of(config.model_type)
    auto = tf.AutoModelForCausalLM if family.causal_lm else tf.AutoModel
    return auto.from_pretrained(folder, dtype=dtype, trust_remote_code=False, local_files_only=True).eval()


def save_tokenizer(path, where: Path) -> bool:
    """Save the folder's tokenizer under ``where``; False when the folder has none."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError):  # a folder with weights but no tokenizer files
        return False
    tok.save_pretrained(where)
    return True


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
    def load(cls, folder: str | Path) -> TextTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(folder, trust_remote_code=False))
