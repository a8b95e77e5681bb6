"""Hugging Face folders loaded safely: local files only, never the folder's code, every weight accounted for.

(A converted run and its tokenizer live in :mod:`attnkit.runs`: ``convert``, ``tokens``.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.errors import AttnkitValueError
from attnkit.integrations.remote_code import check_tokenizer, read_config

#: transformers model types that are bidirectional encoders (loaded with a masked-LM head, examined as encoders)
HF_ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "xlm-roberta", "deberta", "deberta-v2",
                    "mpnet", "camembert", "modernbert"}


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


#: the files a saved tokenizer has one of (a folder with none has no tokenizer)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")


def load_tokenizer(folder: str | Path):
    """The tokenizer saved in ``folder`` (``AutoTokenizer``, local files only), or None when the folder has no
    tokenizer files: the one reader of a folder's tokenizer. A tokenizer that asks for the folder's own code is
    refused by name first (:func:`~attnkit.integrations.remote_code.check_tokenizer`); one that transformers can't
    load is a typed error naming the folder."""
    from attnkit.integrations.hf._deps import transformers

    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    check_tokenizer(folder)
    tf = transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise AttnkitValueError(f"the tokenizer in {str(folder)!r} can't be loaded ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); restore its files, or pass "
                                "token ids (attnkit generate --ids).") from exc
