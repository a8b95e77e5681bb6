"""What a model target names, in one place: every command that takes a model (``doctor``, ``report``,
``generate``) turns the user's string into a :class:`Source` here, and nowhere else.

==================  =====================================================================  =============
target              what is opened                                                          ``kind``
==================  =====================================================================  =============
``tiny``            ``attnkit.models.builders.build_lm("tiny")`` (any preset; fresh weights)  ``preset``
``hf-gpt2-tiny``    GPT-2 from a 2-layer width-32 config, random weights (also               ``hf-tiny``
                    ``hf-llama-tiny``, ``hf-bert-tiny``)
``runs/demo``       an attnkit run folder (its newest checkpoint, verified)                    ``run``
``runs/demo/c..``   one checkpoint folder of a run (``checkpoints/step_NNNNNNNN``)             ``checkpoint``
``path/to/model``   a Hugging Face folder with config.json (weights loaded if present)         ``hf-folder``
==================  =====================================================================  =============

:func:`locate` only reads the string and the file system (cheap: a command checks its other arguments against
it before loading anything); :func:`open_source` loads what it names.

>>> from attnkit.runs import open_source
>>> source = open_source("runs/demo")         # doctest: +SKIP
>>> source.kind, source.loaded, source.tokenizer.encode("hi")  # doctest: +SKIP
('run', True, [104, 105])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from torch import nn

from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError
from attnkit.runs.read import CHECKPOINTS, MANIFEST, is_checkpoint_or_run, is_converted, load_model, metrics_file
from attnkit.runs.tokens import ByteTokenizer, folder_tokenizer, run_tokenizer

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

KINDS = ("preset", "hf-tiny", "run", "checkpoint", "hf-folder")


@dataclass(frozen=True)
class Target:
    """What a target string names, before anything is loaded: its ``kind`` (:data:`KINDS`), the string, and
    the folder for the kinds that have one."""

    kind: str
    name: str
    path: Path | None = None

    @property
    def metrics(self) -> Path | None:
        """The run's ``metrics.jsonl`` (a run or one of its checkpoints), else None."""
        return metrics_file(self.path) if self.kind in ("run", "checkpoint") else None

    @property
    def run_dir(self) -> Path | None:
        """The run folder of a run, or of a checkpoint inside one (``RUN/checkpoints/step_N``), else None: where
        files about the run go (never inside a checkpoint, which pruning deletes)."""
        if self.kind == "run":
            return self.path
        if self.kind == "checkpoint" and self.path.parent.name == CHECKPOINTS:
            return self.path.parent.parent
        return None


@dataclass
class Source:
    """An opened target: the model (eval mode), its tokenizer (``encode``, ``decode``, ``EOS``; None when it has
    none: a Hugging Face config without tokenizer files), its run's ``metrics.jsonl`` (or None), what it is.

    ``loaded``: the weights were read from files (a run, a checkpoint, a Hugging Face folder with weights), so
    checks that only make sense on a fresh initialisation do not apply. ``fresh``: the doctor's reading: True
    for new weights, False for a trained checkpoint, None when unknown (a Hugging Face folder's weights)."""

    model: nn.Module
    target: Target
    loaded: bool
    fresh: bool | None
    find_tokenizer: Callable[[], object | None] = field(default=lambda: None, repr=False)

    @cached_property
    def tokenizer(self):
        """Looked for on first use (the doctor never needs one)."""
        return self.find_tokenizer()

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def hf_tokenizer(self):
        """The Hugging Face tokenizer of the target, of every kind that has one: a converted run's saved one
        (``attnkit convert``), a Hugging Face folder's own; None for bytes (a trained run, a preset) and for a
        target without tokenizer files (``hf-*-tiny``, a folder of weights only)."""
        return getattr(self.tokenizer, "hf", None)

    @property
    def metrics(self) -> Path | None:
        return self.target.metrics


def target_names() -> list[str]:
    """The names a target string reads as something other than a path (presets, ``hf-*-tiny``): a folder given
    one of them as its exact name would be shadowed, so new runs refuse them (:func:`check_folder_name`)."""
    from attnkit.models.builders import PRESETS

    return sorted(PRESETS) + sorted(HF_TINY)


def check_folder_name(value, option: str) -> None:
    """Refuse a new run folder spelled exactly like a named target (``--run-dir nano``): ``generate nano`` would
    otherwise open the preset. The same folder spelled as a path (``./nano``, ``runs/nano``) is accepted."""
    if isinstance(value, str) and value in target_names():
        raise AttnkitValueError(
            f"{option} {value!r} is also the name of a {'preset' if value not in HF_TINY else 'small Hugging Face model'}"
            f", so `attnkit generate {value}` would open that, not this run; name the folder as a path: "
            f"{option} runs/{value} (or ./{value}).")


def locate(target: str, name: str = "target") -> Target:
    """The kind of ``target`` (see the module table). An attnkit run folder is recognised before a Hugging Face
    folder (the trainer writes a ``config.json`` too); a ``config.json`` path names its folder. ``name``: how a
    refusal names the argument (``--compare``).

    A name (a preset, ``hf-*-tiny``) is never a path: ``nano`` is the preset. Where a model folder of that exact
    name is here too (made before new runs refused such names, or by hand), ``nano`` is refused as ambiguous and
    the message gives both spellings: ``./nano`` opens the folder."""
    from attnkit.models.builders import PRESETS

    if target in PRESETS or target in HF_TINY:
        folder = Path(target)
        if folder.is_dir() and (is_checkpoint_or_run(folder) or (folder / "config.json").is_file()):
            what = "the preset" if target in PRESETS else "the small Hugging Face model"
            raise AttnkitValueError(
                f"{name} {target!r} names both {what} {target} and the model folder ./{target} here; write "
                f"./{target} for the folder, or run from another directory (or rename the folder) for {what}.")
        return Target("preset" if target in PRESETS else "hf-tiny", target)
    path = Path(target)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir() and is_checkpoint_or_run(path):
        return Target("checkpoint" if (path / MANIFEST).is_file() else "run", target, path)
    if (path / "config.json").is_file():
        return Target("hf-folder", target, path)
    raise AttnkitValueError(
        f"{name} {target!r} is not a preset ({sorted(PRESETS)}), a small Hugging Face config "
        f"({sorted(HF_TINY)}), an attnkit run/checkpoint folder, or a Hugging Face folder with config.json; "
        f"check the spelling or the path. {_runs_near(path)}"
    )


def _runs_near(path: Path, limit: int = 8) -> str:
    """The run folders a user may have meant: those in ``runs/`` (where ``attnkit train`` writes) and beside
    ``path``, said in one sentence."""
    seen = []
    for folder in dict.fromkeys([Path("runs"), path.parent]):
        try:
            children = sorted(child for child in folder.iterdir() if child.is_dir())
        except OSError:
            continue
        seen += [str(child) for child in children if is_checkpoint_or_run(child) and str(child) not in seen]
    if not seen:
        return (f"No run folder in runs/ or in {str(path.parent)!r} (train one with run_dir='runs/NAME').")
    more = f" and {len(seen) - limit} more" if len(seen) > limit else ""
    return "Runs here: " + ", ".join(seen[:limit]) + more + "."


def open_source(target: str | Target, *, encoder: bool = False, convert: bool = False,
                device: str = "cpu") -> Source:
    """Open ``target`` (a string, see the module table, or a :class:`Target` from :func:`locate`).

    ``encoder``: build a preset as a bidirectional encoder (and load a Hugging Face folder with its masked-LM
    head). ``convert``: a Hugging Face model (folder or ``hf-*-tiny``) is converted to attnkit's model
    (:func:`attnkit.integrations.hf.convert.from_hf`, what ``attnkit convert`` writes), for the commands that
    need attnkit's decoder protocol (``generate``); else the transformers model itself is returned.
    A preset's random weights are drawn from the caller's torch RNG; ``hf-*-tiny`` from :data:`HF_TINY_SEED`."""
    where = locate(target) if isinstance(target, str) else target
    if where.kind == "preset":
        from attnkit.models.builders import build_encoder, build_lm

        model = (build_encoder(where.name) if encoder else build_lm(where.name)).eval()
        return Source(model.to(device), where, False, True, lambda: _byte_tokenizer(model))
    if where.kind in ("run", "checkpoint"):
        model = load_model(where.path, device)
        return Source(model, where, True, False, lambda: run_tokenizer(where.path) or (
            None if is_converted(where.path) else _byte_tokenizer(model)))  # a converted run never speaks bytes
    if where.kind == "hf-tiny":
        model, loaded, tokenizer = hf_tiny(where.name), False, lambda: None
    else:
        from attnkit.integrations.hf.folders import load_hf

        _transformers()  # its missing-package error and quiet logging, as for hf-*-tiny
        # convert: the class holding the folder's weights, as `attnkit convert` loads it
        model = load_hf(where.path, head="masked-lm" if encoder and not convert else "auto")
        loaded, tokenizer = True, lambda: folder_tokenizer(where.path)
    if convert:
        from attnkit.integrations.hf.convert import from_hf

        model = from_hf(model).eval()
    return Source(model.to(device), where, loaded, None if loaded else True, tokenizer)


def _byte_tokenizer(model: nn.Module) -> ByteTokenizer | None:
    """The byte tokenizer when the model's vocabulary is the byte tokenizer's (an attnkit LM), else None."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return ByteTokenizer() if vocab == ByteTokenizer.vocab_size else None


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise EnvironmentUnsupportedError(f"Hugging Face targets need the transformers package ({exc}); install it "
                                          "with pip install transformers.") from exc
    transformers.logging.set_verbosity_error()
    return transformers


HF_TINY_SEED = 0  #: every hf-*-tiny model's weights: one model per name, whichever command opens it


def hf_tiny(name: str):
    """A small Hugging Face model with random weights drawn from :data:`HF_TINY_SEED` (the caller's torch RNG is
    left as it was): ``convert``, ``doctor``, ``generate``, ``report`` and ``heads`` all open the same model."""
    import torch

    tf = _transformers()
    config_cls, model_cls, kwargs = HF_TINY[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(HF_TINY_SEED)
        return getattr(tf, model_cls)(getattr(tf, config_cls)(**kwargs)).eval()

