"""An attnkit run written as a Hugging Face folder that transformers loads: the protocol behind ``attnkit export``,
the mirror of :mod:`attnkit.runs.convert`.

>>> import attnkit as ak
>>> done = ak.runs.export_run("runs/llama", "exported/llama")        # doctest: +SKIP
>>> done.family, done.errors                                          # doctest: +SKIP
('llama', {'logits': 4.0e-06})

The family is ``family`` if given, else the one the run was converted from, else the first registered family
(:func:`attnkit.integrations.hf.convert.exportable_families`: every family registered with ``register_family`` that
has a transformers class) whose config expresses the model exactly; a model no family expresses is refused with
each field named. BERT exports as ``BertModel`` (with its pooler when the model has one; attnkit's encoder has no
MLM head: its logits are the hidden states times the word embeddings).

What the folder says besides the weights is the model's own: the special-token ids and the generation config a
converted run recorded from its source (never the family's defaults: LLaMA's eos 2, GPT-2's 50256), a trained
run's byte tokenizer (``EOS = 256``) written as a transformers tokenizer; a converted run's tokenizer is copied.

Before anything is written where ``out`` is, the folder is saved beside it, loaded back with ``from_pretrained``
and every output the family has (logits; BERT's ``pooler_output`` too) checked against the attnkit model's with the
tolerance rule (:mod:`attnkit._tolerance`, the float64 model as the oracle); only then does it take ``out``'s
place. ``out`` must be absent or empty, or with ``overwrite`` an earlier export (:func:`not_an_export`): a run
folder or a folder holding anything else is refused, nothing unknown is deleted, a symbolic link is never written
through. Every refusal comes before the model is loaded.

Shape legend: B batch (1), L probe length, V vocabulary, E hidden size.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnkit.errors import AttnkitValueError, BackendUnsupportedError, EnvironmentUnsupportedError
from attnkit.runs.read import read_state, resolve
from attnkit.runs.source import locate, open_source
from attnkit.runs.tokens import ByteTokenizer, run_tokenizer

#: the files ``save_pretrained`` writes for a model and its tokenizer: a folder holding only these (and a
#: config.json of a transformers model, and weights) is an earlier export; anything else is the user's
EXPORT_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json"})
SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
#: the special-token fields of a transformers config that an export writes from the model, never from defaults
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class Export:
    """What :func:`export_run` wrote: the folder, the family, ``max|from_pretrained - attnkit|`` per output."""

    path: Path
    family: str
    errors: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        diffs = ", ".join(f"{name} {err:.2e}" for name, err in self.errors.items())
        return f"wrote {self.path} ({self.family}); from_pretrained vs attnkit, max |diff|: {diffs}"


def not_an_export(folder: Path) -> str | None:
    """Why ``folder`` is not an earlier export (None when it is one). Recognised positively: a transformers
    ``config.json`` (a ``model_type``, no attnkit ``run_id``), weights, and nothing but regular files that
    ``save_pretrained`` writes: a run (``checkpoints/``, ``metrics.jsonl``, its lock) or any other file is not."""
    from attnkit._files import not_ours

    why, config = not_ours(folder, lambda name: name in EXPORT_FILES or bool(SHARD.match(name)), "an export",
                           "config.json")
    if why:
        return why
    if not isinstance(config, dict) or "model_type" not in config or "run_id" in config:
        return "its config.json is not a transformers model config (no model_type, or an attnkit run's run_id)"
    if not any((folder / name).is_file() for name in WEIGHTS):
        return f"it has no weights ({' or '.join(WEIGHTS)})"
    return None


def check_out(out: str | Path, overwrite: bool) -> Path:
    """``out`` as a Path, or a typed error when it may not be written (before anything heavy is imported)."""
    out = Path(out)
    if out.is_symlink():
        raise AttnkitValueError(f"out={str(out)!r} is a symbolic link; export never writes "
                                "through links: pass the real folder.")
    if out.exists() and not out.is_dir():
        raise AttnkitValueError(f"out={str(out)!r} is a file; pass a folder (absent or empty).")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise AttnkitValueError(f"out={str(out)!r} is not empty; pass overwrite=True to replace an "
                                    "earlier export, or pick another folder.")
        why = not_an_export(out)
        if why is not None:
            raise AttnkitValueError(f"out={str(out)!r} is not an earlier export: {why}; overwrite=True replaces "
                                    "only a folder `attnkit export` wrote and deletes nothing else: pick another "
                                    "folder, or move those files away.")
    return out


def check_run(run_path: str | Path):
    """The :class:`~attnkit.runs.source.Target` of ``run_path``, refused unless it is a run or checkpoint folder."""
    try:
        where = locate(str(run_path))  # the one reading of a target string (runs/source.py)
    except AttnkitValueError:
        where = None
    if where is None or where.kind not in ("run", "checkpoint"):
        kind = "nothing attnkit opens" if where is None else f"a {where.kind} target"
        raise AttnkitValueError(f"run_path={str(run_path)!r} is not a run or checkpoint folder ({kind}); pass a "
                                "folder attnkit's trainer or `attnkit convert` wrote (a Hugging Face "
                                "model is one already: `attnkit convert` it first to export it as another family).")
    return where


def pick_family(model, state: dict, family: str | None) -> str:
    """``family`` if given, else the run's converted ``model_type``, else the first registered family that
    expresses ``model`` exactly (:func:`~attnkit.integrations.hf.convert.exportable_families`)."""
    from attnkit.integrations.hf.convert import exportable_families, hf_config_for

    exportable = exportable_families()
    if family is not None:
        if family not in exportable:
            raise AttnkitValueError(f"family={family!r} is not one of {exportable} (the registered families "
                                    "with a transformers class).")
        return family
    source = (state.get("converted_from") or {}).get("model_type")
    if source in exportable:
        return source
    why = {}
    for name in exportable:
        try:
            hf_config_for(model, name)  # raises, naming the fields, when the family can't express the model
            return name
        except (BackendUnsupportedError, AttnkitValueError) as exc:
            why[name] = str(exc)
    raise BackendUnsupportedError("the model has no exact Hugging Face form: " + " ".join(
        f"[{name}] {text}" for name, text in why.items()) + " Train or convert a model with one family's parts.",
        sorted(why))


def own_tokens(model, state: dict, tokenizer) -> tuple[dict, dict]:
    """``(special-token ids, generation config)`` of the run: what a converted run recorded from its source's
    config, else its saved tokenizer's ids; a trained run speaks bytes (eos = ``ByteTokenizer.EOS``, no bos, no
    pad). Never a family's defaults."""
    source = state.get("converted_from") or {}
    if isinstance(source.get("special_tokens"), dict):
        return dict(source["special_tokens"]), dict(source.get("generation") or {})
    if tokenizer is not None:  # a converted run written before the ids were recorded: its tokenizer's
        return {name: getattr(tokenizer.hf, name, None) for name in SPECIAL_TOKENS}, {}
    eos = ByteTokenizer.EOS if model.config.vocab_size == ByteTokenizer.vocab_size and not source else None
    return {"bos_token_id": None, "eos_token_id": eos, "pad_token_id": None}, {}


def export_run(run_path: str | Path, out: str | Path, *, family: str | None = None,
               overwrite: bool = False) -> Export:
    """Write the run (or checkpoint) at ``run_path`` as a Hugging Face folder ``out`` (see the module docstring);
    every refusal (not a run, ``out`` not writable, no family that expresses the model) is a typed error raised
    before ``out`` is touched."""
    where = check_run(run_path)
    out = check_out(out, overwrite)
    from attnkit.integrations.hf.convert import to_hf

    model = open_source(where).model
    state = read_state(resolve(where.path))
    family = pick_family(model, state, family)
    tokenizer = run_tokenizer(where.path)
    special, generation = own_tokens(model, state, tokenizer)
    hf = to_hf(model, family, special_tokens=special, generation=generation)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the export is a normal folder
    try:
        hf.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.hf.save_pretrained(staging)
        elif special["eos_token_id"] == ByteTokenizer.EOS:
            from attnkit.integrations.hf.tokenizer import byte_tokenizer

            byte_tokenizer().save_pretrained(staging)
        errors = verify(model, staging, family)
        check_out(out, overwrite)  # again: OUT may have changed while we worked
        if out.is_dir():
            shutil.rmtree(out)  # removes links inside, never follows them
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Export(out, family, errors)


def verify(model, folder: Path, family: str) -> dict[str, float]:
    """Load ``folder`` with ``from_pretrained`` and check every output the family has against ``model``'s by the
    tolerance rule (:func:`attnkit._tolerance.within_rule`, golden = ``model`` in float64); an output one side has
    and the other lacks fails. Returns ``max|hf - golden|`` per output."""
    import copy

    import torch

    from attnkit._tolerance import within_rule
    from attnkit.integrations.hf._deps import transformers
    from attnkit.integrations.hf.convert import attnkit_outputs, hf_outputs
    from attnkit.integrations.hf.folders import load_hf

    tf = transformers()
    dtype = next(model.parameters()).dtype
    hf = load_hf(folder, dtype=dtype)  # from_pretrained, local files, no remote code, the class it was saved as
    cfg = model.config
    L = min(16, cfg.max_seq_len)
    tokens = torch.randint(0, cfg.vocab_size, (1, L), generator=torch.Generator().manual_seed(0))  # (B, L)
    with torch.no_grad():
        golden = attnkit_outputs(copy.deepcopy(model).double(), tokens)  # name -> (B, L, V) | (B, E)
        ours, got = attnkit_outputs(model, tokens), hf_outputs(hf, tokens)
    if set(got) != set(golden):
        raise EnvironmentUnsupportedError(
            f"the exported {family} folder gives the outputs {sorted(got)} where the attnkit model gives "
            f"{sorted(golden)}; nothing was written to out. Report it with the run.")
    errors, bad = {}, []
    for name in golden:
        result = within_rule(got[name], ours[name], golden[name], dtype=dtype)
        errors[name] = result.err
        if not result.ok:
            bad.append(result.describe(name, dtype))
    if bad:
        raise EnvironmentUnsupportedError(
            f"transformers {tf.__version__} loads the exported {family} folder with outputs off: {'; '.join(bad)} "
            "(attnkit's own error against float64 is the reference); nothing was written to out. "
            "Report it with the run.")
    return errors
