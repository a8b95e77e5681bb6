"""``attnkit convert``: a Hugging Face model folder as an attnkit run (weights mapped, tokenizer kept).

    attnkit convert --hf path/to/hf_model --out runs/llama
    attnkit generate --checkpoint runs/llama --prompt "Once upon a time" --temperature 0
    attnkit doctor runs/llama

``--hf`` is read as every command reads a model target (:func:`attnkit.runs.locate`): a Hugging Face folder or
``hf-gpt2-tiny`` / ``hf-llama-tiny`` (random weights); an attnkit run is refused (it needs no converting).
GPT-2, LLaMA, Mistral, Qwen2 and BERT folders convert; a config attnkit can't reproduce exactly is refused
with the field named (exit status 2). ``--out`` follows the trainer's run-folder rules
(:mod:`attnkit.runs.convert`): a folder that already holds a run or other files is refused unless
``--overwrite``, which keeps the old run aside until the converted checkpoint is written.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face model folder into an attnkit run folder")
    p.add_argument("--hf", required=True, help="a local Hugging Face folder (config.json + weights [+ tokenizer]), or "
                                               "hf-*-tiny: the targets doctor/generate/report read (runs.locate)")
    p.add_argument("--out", required=True, help="the run folder to write (checkpoints/step_00000000, tokenizer/)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    p.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out (kept aside until the converted checkpoint is written)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit.runs.convert import convert_folder

    where = convert_folder(args.hf, args.out, dtype=getattr(torch, args.dtype), overwrite=args.overwrite)
    print(f"wrote {where}")
    return 0
