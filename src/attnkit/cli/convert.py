"""``attnkit convert``: a Hugging Face model folder as an attnkit run (weights mapped, tokenizer kept).

    attnkit convert --hf path/to/hf_model --out runs/llama
    attnkit generate --checkpoint runs/llama --prompt "Once upon a time" --temperature 0
    attnkit doctor runs/llama

GPT-2, LLaMA, Mistral, Qwen2 and BERT folders convert; a config attnkit can't reproduce exactly is refused
with the field named (exit status 2). ``--out`` follows the trainer's run-folder rules
(:class:`attnkit.training.runs.RunFolder`): a folder that already holds a run or other files is refused unless
``--overwrite``, which keeps the old run aside until the converted checkpoint is written.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face model folder into an attnkit run folder")
    p.add_argument("--hf", required=True, help="a local Hugging Face folder (config.json + weights [+ tokenizer])")
    p.add_argument("--out", required=True, help="the run folder to write (checkpoints/step_00000000, tokenizer/)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    p.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out (kept aside until the converted checkpoint is written)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    where = convert_folder(args.hf, args.out, dtype=getattr(torch, args.dtype), overwrite=args.overwrite)
    print(f"wrote {where}")
    return 0


def convert_folder(path, out, *, dtype=None, overwrite: bool = False):
    """Convert the HF folder ``path`` into the attnkit run folder ``out``; returns the checkpoint folder.

    The model is loaded and converted before ``out`` is touched; ``out`` is then locked and checked as the trainer
    checks a new run's folder (refused when it holds a run or other files, unless ``overwrite``)."""
    from pathlib import Path

    import transformers

    from attnkit.integrations.hf.convert import from_hf, source_dropout
    from attnkit.integrations.hf.folders import TOKENIZER_DIR, load_hf, save_tokenizer
    from attnkit.training.checkpoint import save_checkpoint
    from attnkit.training.runs import RunFolder

    hf = load_hf(path, **({} if dtype is None else {"dtype": dtype}))
    model = from_hf(hf)
    source = {"path": str(Path(path).resolve()), "model_type": hf.config.model_type,
              "transformers": transformers.__version__, "dropout": source_dropout(hf.config)}
    folder = RunFolder(out, log=print, option="--out")
    folder.check_fresh(overwrite)  # before creating anything (a refused folder is left exactly as it was)
    folder.acquire()
    try:
        folder.check_fresh(overwrite)  # again under the lock
        if overwrite:
            folder.set_aside()
        has_tokenizer = save_tokenizer(path, Path(out) / TOKENIZER_DIR)
        state = {"model_config": model.config.to_dict(), "converted_from": source,
                 "tokenizer": TOKENIZER_DIR if has_tokenizer else None}
        where = save_checkpoint(out, 0, model, None, state, keep=0)  # the folder holds no other checkpoint
        folder.committed()
        return where
    except BaseException:
        folder.abandon()
        raise
    finally:
        folder.release()
