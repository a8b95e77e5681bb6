"""``attnkit export RUN --hf OUT``: an attnkit run as a Hugging Face folder that transformers loads.

    attnkit export runs/llama --hf exported/llama            # family from the run (converted: its model_type)
    attnkit export runs/mine --hf exported/mine --family qwen2 --overwrite
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('exported/llama')"

The family (GPT-2, LLaMA, Mistral, Qwen2, BERT) is the one the run was converted from, else the first whose
config can express the model exactly (``--family`` picks one); a model no family expresses is refused with each
field named. BERT exports as ``BertModel`` (attnkit's encoder has no MLM head; its logits are the hidden states
times the word embeddings). A converted run's tokenizer is copied along; a trained run speaks bytes and has none.

Before anything is written where ``OUT`` is, the folder is saved beside it, loaded back with ``from_pretrained``
and its logits checked against the attnkit model's with the tolerance rule of ``docs/conventions.md`` (the
float64 model as the oracle); only then does it take ``OUT``'s place. ``OUT`` must be absent or empty, or with
``--overwrite`` an earlier export (:func:`not_an_export`: a transformers ``config.json``, weights, and only the files
``save_pretrained`` writes): a run folder or a folder holding anything else is refused, nothing unknown is deleted,
and a symbolic link is never written through.

Shape legend: B batch (1), L probe length, V vocabulary, E hidden size.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from attnkit.errors import AttnkitValueError, BackendUnsupportedError, EnvironmentUnsupportedError

#: the order in which a trained run's config is matched against the families (first exact one wins)
ORDER = ("gpt2", "llama", "mistral", "qwen2", "bert")


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a run as a Hugging Face folder (from_pretrained gives the same logits)")
    p.add_argument("run_path", metavar="RUN", help="a run folder (its newest checkpoint) or one checkpoint folder")
    p.add_argument("--hf", required=True, metavar="OUT", help="the Hugging Face folder to write (absent or empty)")
    p.add_argument("--family", help=f"the transformers family to write ({', '.join(ORDER)}; default: the run's own)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier Hugging Face folder at OUT")
    p.set_defaults(run=run)


def run(args) -> int:
    where, family, err = export_run(args.run_path, args.hf, family=args.family, overwrite=args.overwrite)
    print(f"wrote {where} ({family}); from_pretrained logits vs attnkit: max |diff| {err:.2e}")
    return 0


#: the files ``save_pretrained`` writes for a model and its tokenizer: a folder holding only these (and a
#: config.json of a transformers model, and weights) is an earlier export; anything else is the user's
EXPORT_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json"})
SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


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
        raise AttnkitValueError(f"--hf {str(out)!r} is a symbolic link; export never writes "
                                "through links: pass the real folder.")
    if out.exists() and not out.is_dir():
        raise AttnkitValueError(f"--hf {str(out)!r} is a file; pass a folder (absent or empty).")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise AttnkitValueError(f"--hf {str(out)!r} is not empty; pass --overwrite to replace an "
                                    "earlier export, or pick another folder.")
        why = not_an_export(out)
        if why is not None:
            raise AttnkitValueError(f"--hf {str(out)!r} is not an earlier export: {why}; --overwrite replaces only "
                                    "a folder `attnkit export` wrote and deletes nothing else: pick another folder, "
                                    "or move those files away.")
    return out


def pick_family(model, state: dict, family: str | None) -> str:
    """``family`` if given, else the run's converted ``model_type``, else the first of :data:`ORDER` that
    expresses ``model`` exactly."""
    from attnkit.integrations.hf.convert import FAMILIES, hf_config_for

    exportable = [name for name in ORDER if FAMILIES.get(name) and FAMILIES[name].causal_lm]
    if family is not None:
        if family not in exportable:
            raise AttnkitValueError(f"--family {family!r} is not one of {exportable}.")
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


def export_run(run_path: str | Path, out: str | Path, *, family: str | None = None,
               overwrite: bool = False) -> tuple[Path, str, float]:
    """Write the run at ``run_path`` as a Hugging Face folder ``out``; returns ``(out, family, max |logit diff|)``."""
    from attnkit.runs import locate

    try:
        where = locate(str(run_path))  # the one reading of a target string (runs/source.py)
    except AttnkitValueError:
        where = None
    if where is None or where.kind not in ("run", "checkpoint"):
        kind = "nothing attnkit opens" if where is None else f"a {where.kind} target"
        raise AttnkitValueError(f"RUN {str(run_path)!r} is not a run or checkpoint folder ({kind}); pass a "
                                "folder `attnkit train --run-dir` or `attnkit convert --out` wrote (a Hugging Face "
                                "model is one already: `attnkit convert` it first to export it as another family).")
    out = check_out(out, overwrite)
    from attnkit.integrations.hf.convert import to_hf
    from attnkit.runs import open_source, read_state, resolve, run_tokenizer

    model = open_source(where).model
    family = pick_family(model, read_state(resolve(where.path)), family)
    hf = to_hf(model, family)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the export is a normal folder
    try:
        hf.save_pretrained(staging)
        tokenizer = run_tokenizer(run_path)
        if tokenizer is not None:
            tokenizer.hf.save_pretrained(staging)
        err = verify(model, staging, family)
        check_out(out, overwrite)  # again: OUT may have changed while we worked
        if out.is_dir():
            shutil.rmtree(out)  # removes links inside, never follows them
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out, family, err


def verify(model, folder: Path, family: str) -> float:
    """Load ``folder`` with ``from_pretrained`` and check its logits against ``model``'s: ``max|hf - golden| <=
    2 * max|model - golden| + 4 eps max(1, max|golden|)`` with golden = ``model`` in float64. Returns the error."""
    import copy

    import torch

    from attnkit.integrations.hf._deps import transformers
    from attnkit.integrations.hf.folders import load_hf

    tf = transformers()
    hf = load_hf(folder, dtype=next(model.parameters()).dtype)  # from_pretrained, local files, no remote code
    cfg = model.config
    L = min(16, cfg.max_seq_len)
    tokens = torch.randint(0, cfg.vocab_size, (1, L), generator=torch.Generator().manual_seed(0))  # (B, L)
    with torch.no_grad():
        golden = copy.deepcopy(model).double()(tokens)  # (B, L, V)
        ours = model(tokens).double()
        if family == "bert":  # (B, L, E) hidden states times the tied embeddings
            got = (hf(input_ids=tokens).last_hidden_state @ hf.get_input_embeddings().weight.T).double()
        else:
            got = hf(input_ids=tokens).logits.double()
    err, ref_err = (got - golden).abs().max().item(), (ours - golden).abs().max().item()
    floor = 4 * torch.finfo(next(model.parameters()).dtype).eps * max(1.0, golden.abs().max().item())
    if not err <= 2 * ref_err + floor:
        raise EnvironmentUnsupportedError(
            f"transformers {tf.__version__} loads the exported {family} folder with logits off by "
            f"{err:.3g} (attnkit's own error against float64: {ref_err:.3g}); nothing was written to the --hf folder. "
            "Report it with the run.")
    return err
