"""A Hugging Face model folder written as an attnkit run: the protocol behind ``attnkit convert``.

The model is loaded and converted before the run folder is touched; the folder is then locked and checked as
the trainer checks a new run's folder (:class:`attnkit.runs.folder.RunFolder`: refused when it holds a run or
other files, unless ``overwrite``, which keeps the old run aside until the converted checkpoint is written). The
run holds ``checkpoints/step_00000000/`` (no optimizer state) and the model's own tokenizer (``tokenizer/``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.errors import AttnkitValueError
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import is_checkpoint_or_run
from attnkit.runs.source import HF_TINY, check_folder_name, hf_tiny, locate
from attnkit.runs.tokens import TOKENIZER_DIR, folder_tokenizer
from attnkit.runs.write import save_checkpoint, writing


def own_tokens(hf) -> dict:
    """What an export writes back as the model's own (:mod:`attnkit.runs.export`): the special-token ids of the
    source's config and its generation config (``to_diff_dict``: the fields that differ from the defaults)."""
    from attnkit.runs.export import SPECIAL_TOKENS

    generation = getattr(hf, "generation_config", None) if hf.can_generate() else None
    diff = {} if generation is None else {k: v for k, v in generation.to_diff_dict().items()
                                          if k != "transformers_version"}
    return {"special_tokens": {name: getattr(hf.config, name, None) for name in SPECIAL_TOKENS}, "generation": diff}


def convert_folder(path: str | Path, out: str | Path, *, dtype: torch.dtype | None = None, overwrite: bool = False,
                   log=print) -> Path:
    """Convert the Hugging Face model ``path`` into the attnkit run folder ``out``; return the checkpoint folder.
    ``path`` is a target as every command reads it (:func:`attnkit.runs.locate`): a Hugging Face folder, or
    ``hf-*-tiny`` (the seeded weights every command opens: :func:`attnkit.runs.source.hf_tiny`); an attnkit run,
    checkpoint or preset is refused. A folder without ``config.json`` is refused at once, before transformers is
    imported, and so is an ``out`` spelled like a preset (:func:`attnkit.runs.source.check_folder_name`)."""
    check_folder_name(str(out) if isinstance(out, str) else None, "out")
    if str(path) not in HF_TINY and not (Path(path) / "config.json").is_file() and not is_checkpoint_or_run(path):
        raise AttnkitValueError(f"path={str(path)!r} is not a Hugging Face model folder (" + (
            "it does not exist" if not Path(path).exists() else "no config.json") + "); pass the folder "
            "from_pretrained loads (config.json and the weights), e.g. one written by save_pretrained, or hf-*-tiny.")
    where = locate(str(path))
    if where.kind not in ("hf-folder", "hf-tiny"):
        raise AttnkitValueError(f"path={str(path)!r} is an attnkit {where.kind}, not a Hugging Face model; convert "
                                "takes a Hugging Face folder (config.json + weights) or hf-*-tiny (an attnkit run "
                                "needs no converting: pass it to generate, doctor or export as it is).")
    log(f"convert: loading {path} with transformers")  # progress: each phase says itself (the load takes longest)
    import transformers

    from attnkit.integrations.hf.convert import from_hf, source_dropout
    from attnkit.integrations.hf.folders import load_hf

    dtypes = {} if dtype is None else {"dtype": dtype}
    hf = hf_tiny(where.name).to(**dtypes) if where.path is None else load_hf(where.path, **dtypes)
    model = from_hf(hf)
    log(f"convert: {hf.config.model_type} -> attnkit, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M "
        f"parameters; writing {out}")
    source = {"path": where.name if where.path is None else str(where.path.resolve()),
              "model_type": hf.config.model_type, "transformers": transformers.__version__,
              "dropout": source_dropout(hf.config), **own_tokens(hf)}
    # a tokenizer asking for the folder's code is refused before anything; hf-*-tiny has none
    tokenizer = None if where.path is None else folder_tokenizer(where.path)
    if tokenizer is None:
        log(f"note: {path} has no tokenizer files, so the run has none: `attnkit generate` and the report need "
            "token ids; copy the model's tokenizer files into the folder and convert again to keep it")
    folder = RunFolder(out, log=log, option="out")
    folder.check_fresh(overwrite)  # before creating anything (a refused folder is left exactly as it was)
    folder.acquire()
    try:
        folder.check_fresh(overwrite)  # again under the lock
        if overwrite:
            folder.set_aside()
        if tokenizer is not None:
            with writing(Path(out) / TOKENIZER_DIR):  # disk full, read-only: typed, the old run restored
                tokenizer.hf.save_pretrained(Path(out) / TOKENIZER_DIR)
        state = {"model_config": model.config.to_dict(), "converted_from": source,
                 "tokenizer": TOKENIZER_DIR if tokenizer is not None else None}
        where = save_checkpoint(out, 0, model, None, state, keep=0)  # the folder holds no other checkpoint
        folder.committed()
        return where
    except BaseException:
        folder.abandon()
        raise
    finally:
        folder.release()
