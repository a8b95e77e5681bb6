"""Hugging Face folders loaded safely: local files only, never the folder's code, every weight accounted for.

(A converted run and its tokenizer live in :mod:`attnkit.runs`: ``convert``, ``tokens``.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError
from attnkit.integrations.remote_code import check_tokenizer, read_config

#: transformers model types that are bidirectional encoders (loaded with a masked-LM head, examined as encoders)
HF_ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "xlm-roberta", "deberta", "deberta-v2",
                    "mpnet", "camembert", "modernbert"}

#: what ``load_hf(path, head=...)`` builds: ``"auto"`` the class that holds the folder's weights (the first of
#: ``config.architectures`` transformers has: all-MiniLM-L6-v2's ``BertModel``, never a head the folder lacks),
#: ``"lm"`` the language-model head of the model type (masked-LM for an encoder, causal-LM for a decoder),
#: ``"masked-lm"`` the masked-LM head, ``"base"`` the base model without a head
HEADS = ("auto", "lm", "masked-lm", "base")


def is_encoder(config) -> bool:
    """The one notion of encoder: a bidirectional model type (:data:`HF_ENCODER_TYPES`) not configured as a
    decoder (``is_decoder``)."""
    return config.model_type in HF_ENCODER_TYPES and not bool(getattr(config, "is_decoder", False))


def model_class(tf, config, head: str = "auto"):
    """The transformers class :func:`load_hf` builds for ``config`` and ``head`` (:data:`HEADS`)."""
    if head not in HEADS:
        raise AttnkitValueError(f"head must be one of {HEADS}, got {head!r}; 'auto' loads the class the folder's "
                                "weights were saved from.")
    if head == "base":
        return tf.AutoModel
    if head == "auto":
        for name in getattr(config, "architectures", None) or ():
            if isinstance(name, str) and isinstance(getattr(tf, name, None), type):
                return getattr(tf, name)
    if head == "masked-lm" or is_encoder(config):
        return tf.AutoModelForMaskedLM
    return tf.AutoModelForCausalLM


def load_hf(path: str | Path, *, head: str = "auto", dtype: torch.dtype = torch.float32):
    """The transformers model of the local folder ``path`` in eval mode, weights included, never running code
    from the folder: ``trust_remote_code=False``, a config with ``auto_map`` refused
    (:class:`~attnkit.integrations.remote_code.RemoteCodeRefused`), a malformed config.json, a folder without
    weights and a model larger than the memory here typed errors before anything is built. ``head``
    (:data:`HEADS`) picks the class (:func:`model_class`). A pooler the files lack is removed (never random
    weights); with ``head="masked-lm"`` an absent masked-LM head is allowed (a sentence-embedding checkpoint)."""
    from attnkit.integrations.hf._deps import transformers

    tf = transformers()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise AttnkitValueError(f"path={str(path)!r} is not a Hugging Face model folder (no config.json); pass the "
                                "folder that holds config.json and the weights.")
    config = load_config(folder)  # refuses auto_map (custom code) and a malformed config.json first
    auto = model_class(tf, config, head)
    check_weights(auto, config, folder, dtype)
    optional = ("pooler.", "cls.") if head == "masked-lm" else ("pooler.",)
    return load_pretrained(auto, folder, optional=optional, dtype=dtype)


#: config.json fields that are sizes when present: a positive int (a wrong type crashes deep in transformers)
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions")
#: config.json fields that are numbers when present (null allowed: transformers' default)
NUMBER_FIELDS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "initializer_range")


def load_config(folder: Path):
    """The transformers config of ``folder``: ``auto_map`` refused (custom code), then a ``config.json`` that
    transformers would crash on (no ``model_type``, a size that is not a positive int, a number field that is not a
    number, any other field transformers rejects) is a typed error naming config.json and the field."""
    from attnkit.integrations.hf._deps import transformers

    raw = read_config(folder)
    where = str(Path(folder) / "config.json")
    restore = "restore the config.json that save_pretrained wrote with the weights."

    def bad(field: str, expected: str):
        raise AttnkitValueError(f"{where!r}: field {field!r} is {raw.get(field)!r}, expected {expected}; {restore}")

    if not isinstance(raw.get("model_type"), str):
        bad("model_type", "the model's type as a string (e.g. 'llama')")
    for name in SIZE_FIELDS:
        value = raw.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad(name, "a positive int")
    for name in NUMBER_FIELDS:
        value = raw.get(name, 1.0)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            bad(name, "a number")
    check_attn_implementation(raw.get("attn_implementation"), where)
    try:
        return transformers().AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers' and huggingface_hub's own validation errors vary
        detail = " ".join(line.strip() for line in str(exc).splitlines()[:2])[:300]
        raise AttnkitValueError(f"{where!r} is not a config transformers accepts ({type(exc).__name__}: {detail}); "
                                f"{restore}") from exc


def check_attn_implementation(name, where: str) -> None:
    """Refuse a config.json whose ``attn_implementation`` this machine can't run (a flash-attention kernel whose
    package is absent, a kernel from the Hub: attnkit loads local files only) before any model is built:
    transformers raised an ImportError from deep inside building the model."""
    from attnkit.integrations.hf._deps import transformers

    if name is None:
        return
    fix = "remove the field from config.json (the model then loads with transformers' default attention)"
    if not isinstance(name, str):
        raise AttnkitValueError(f"{where!r}: field 'attn_implementation' is {name!r}, expected a name such as 'sdpa' "
                                f"or 'eager'; {fix}.")
    if "/" in name:
        raise EnvironmentUnsupportedError(f"{where!r}: field 'attn_implementation' is {name!r}, a kernel from the "
                                          f"Hugging Face Hub; attnkit loads local files only: {fix}.")
    if name.startswith("flash_attention_"):
        version = name.removeprefix("flash_attention_")
        available = getattr(transformers().utils, f"is_flash_attn_{version}_available", None)
        if available is None or not available():
            raise EnvironmentUnsupportedError(
                f"{where!r}: field 'attn_implementation' is {name!r}, which needs the flash-attn package "
                f"(version {version}) and a CUDA GPU, not available here; {fix}, or set it to 'sdpa'.")


def has_weights(folder: Path) -> bool:
    return any(Path(folder).glob("*.safetensors")) or any(Path(folder).glob("*.bin"))


def check_weights(auto, config, folder: Path, dtype: torch.dtype = torch.float32) -> int:
    """Before a model is built from ``folder``: refuse a folder without weight files, and a model larger than the
    memory available here, saying the size in both cases. Returns the bytes the weights take in ``dtype``."""
    with torch.device("meta"):  # the architecture without memory: its parameter count
        model = auto.from_config(config, trust_remote_code=False) if hasattr(auto, "from_config") else auto(config)
        params = sum(p.numel() for p in model.parameters())
    need = params * dtype.itemsize
    size = f"{params:,} parameters, {need / 2**30:.2f} GiB in {str(dtype).removeprefix('torch.')}"
    if not has_weights(folder):
        raise AttnkitValueError(
            f"{str(folder)!r} has a config.json but no weights (*.safetensors or *.bin): there is no trained model to "
            f"load, only an architecture ({config.model_type}, {size}); add the weight files (save_pretrained writes "
            "them), or build random weights of it in Python (AutoModelForCausalLM.from_config) and pass the model.")
    free = available_memory()
    if free is not None and need > free:
        raise EnvironmentUnsupportedError(
            f"{str(folder)!r} holds a model of {size}, more than the {free / 2**30:.2f} GiB of memory available here; "
            "use a machine with more memory (or a smaller model).")
    return need


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (``MemAvailable`` of /proc/meminfo), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


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
    base = getattr(model, "base_model", model)
    if any("pooler" in k.split(".") for k in info.get("missing_keys", ())) and getattr(base, "pooler", None) is not None:
        base.pooler = None  # the files have no pooler: none, rather than random weights (pooler_output None)
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
                                "token ids instead of text.") from exc
