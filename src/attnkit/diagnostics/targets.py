"""Turn a command-line target into a model for the doctor: an attnkit preset, an attnkit checkpoint, a Hugging
Face model folder (or config.json), or one of the small Hugging Face configs built with random weights.

==================  =====================================================================
target              what is examined
==================  =====================================================================
``tiny``            ``attnkit.models.builders.build_lm("tiny")`` (any preset; fresh weights)
``hf-gpt2-tiny``    GPT-2 from a 2-layer width-32 config, random weights (also ``hf-llama-tiny``, ``hf-bert-tiny``)
``runs/demo``       an attnkit run or checkpoint folder (trained weights)
``path/to/model``   a Hugging Face folder with config.json (weights loaded if present)
==================  =====================================================================
"""

from __future__ import annotations

from pathlib import Path

from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError
from attnkit.integrations.remote_code import RemoteCodeRefused, read_config  # noqa: F401  (re-exported)
from attnkit.models.io import is_checkpoint_or_run, load_model

HF_TINY = {
    "hf-gpt2-tiny": ("GPT2Config", "GPT2LMHeadModel",
                     {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 128, "n_positions": 64,
                      "bos_token_id": 1, "eos_token_id": 1}),
    "hf-llama-tiny": ("LlamaConfig", "LlamaForCausalLM",
                      {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64,
                       "bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 0}),
    "hf-bert-tiny": ("BertConfig", "BertForMaskedLM",
                     {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
                      "vocab_size": 128, "max_position_embeddings": 64}),
}


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise EnvironmentUnsupportedError(f"Hugging Face targets need the transformers package ({exc}); install it "
                                          "with pip install transformers.") from exc
    transformers.logging.set_verbosity_error()
    return transformers


def hf_tiny(name: str):
    """A small Hugging Face model with random weights (seeded by the caller's torch RNG)."""
    tf = _transformers()
    config_cls, model_cls, kwargs = HF_TINY[name]
    return getattr(tf, model_cls)(getattr(tf, config_cls)(**kwargs)).eval()


def hf_class(tf, config, *, encoder: bool = False):
    """The class that holds the folder's weights: the first of ``config.architectures`` that transformers has
    (MiniLM: ``BertModel``, never a head the folder lacks), else the Auto class of the model type."""
    from attnkit.diagnostics.subjects import HF_ENCODER_TYPES

    for name in getattr(config, "architectures", None) or ():
        if isinstance(name, str) and isinstance(getattr(tf, name, None), type):
            return getattr(tf, name)
    return tf.AutoModelForMaskedLM if encoder or config.model_type in HF_ENCODER_TYPES else tf.AutoModelForCausalLM


def load_hf_folder(path: Path, *, encoder: bool = False):
    """``(model, fresh)`` for a Hugging Face folder, never running its code: ``trust_remote_code=False`` and
    a config with ``auto_map`` (custom modelling code in the folder) is refused with :class:`RemoteCodeRefused`.
    With weight files the model is the class that holds them (:func:`hf_class`) and ``fresh`` is False (loaded
    weights); a config alone gives new weights (``fresh`` True)."""
    read_config(path)  # refuses auto_map (custom code) before transformers sees the folder
    tf = _transformers()
    config = tf.AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    auto = hf_class(tf, config, encoder=encoder)
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        from attnkit.integrations.hf.folders import load_pretrained

        return load_pretrained(auto, path, optional=("pooler.",)), False
    model = auto.from_config(config, trust_remote_code=False) if hasattr(auto, "from_config") else auto(config)
    return model.eval(), True


def load_target(target: str, *, encoder: bool = False):
    """``(model, fresh)`` for a target string (see the module table); ``fresh`` is True for new weights,
    False for loaded ones (a run, a checkpoint, a Hugging Face folder with weights). An attnkit run folder is
    recognised before a Hugging Face folder (the trainer writes a ``config.json`` too)."""
    from attnkit.models.builders import PRESETS, build_encoder, build_lm

    if target in PRESETS:
        return (build_encoder(target) if encoder else build_lm(target)).eval(), True
    if target in HF_TINY:
        return hf_tiny(target), True
    path = Path(target)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir() and is_checkpoint_or_run(path):
        return load_model(path), False
    if (path / "config.json").is_file():
        return load_hf_folder(path, encoder=encoder)
    raise AttnkitValueError(
        f"doctor target {target!r} is not a preset ({sorted(PRESETS)}), a small Hugging Face config "
        f"({sorted(HF_TINY)}), an attnkit run/checkpoint folder, or a Hugging Face folder with config.json; "
        "check the spelling or the path."
    )
