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
    auto = tf.AutoModelForCausalLM if family.lm_head else tf.AutoModel  # BERT: the encoder (BertModel)
    return load_pretrained(auto, folder, optional=("pooler.",), dtype=dtype)  # BERT's pooler is not converted


def load_pretrained(auto, folder: Path, *, optional: tuple[str, ...] = (), **kwargs):
    """``auto.from_pretrained(folder)`` in eval mode, local files only, never running the folder's code, and
    checked: a weight file that can't be read (pickled objects beyond plain tensors, a corrupt safetensors file)
    raises :class:`~attnkit.errors.AttnkitValueError` naming the folder, and so does a parameter the files lack
    (transformers would fill it with random values) unless its name starts with one of ``optional`` (a head the
    caller does not use)."""
    import pickle

    try:
        model, info = auto.from_pretrained(folder, trust_remote_code=False, local_files_only=True,
                                           output_loading_info=True, **kwargs)
    except pickle.UnpicklingError as exc:
        found = [line.strip() for line in str(exc).splitlines() if "GLOBAL" in line][:1]  # what the pickle calls
        raise AttnkitValueError(
            f"the weights in {str(folder)!r} are a pickle that holds more than plain tensors"
            f"{' (' + found[0] + ')' if found else ''}, and attnkit loads pickles only as tensors (torch.load "
            "weights_only=True): never load it with weights_only=False unless you trust its source; save the "
            "weights as model.safetensors from a trusted copy.") from exc
    except Exception as exc:  # safetensors' error type is not importable portably (SafetensorError)
        if type(exc).__name__ != "SafetensorError":
            raise
        raise AttnkitValueError(f"the weights in {str(folder)!r} are not a readable safetensors file ({exc}); "
                                "restore or re-save model.safetensors.") from exc
    missing = sorted(k for k in (*info.get("missing_keys", ()), *(m[0] if isinstance(m, tuple) else m
                                                                  for m in info.get("mismatched_keys", ())))
                     if not k.startswith(optional))
    if missing:
        raise AttnkitValueError(
            f"the weights in {str(folder)!r} lack {len(missing)} parameter(s) the model needs ({missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}); transformers would fill them with random values. Restore the "
            "complete weight files (all shards of model.safetensors).")
    return model.eval()


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
