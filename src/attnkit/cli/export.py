"""``attnkit export RUN --hf OUT``: an attnkit run as a Hugging Face folder that transformers loads.

    attnkit export runs/llama --hf exported/llama            # family from the run (converted: its model_type)
    attnkit export runs/mine --hf exported/mine --family qwen2 --overwrite
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('exported/llama')"

The library call is :func:`attnkit.runs.export_run` (its refusals, the family choice, the check of every output
against the attnkit model before OUT is written: :mod:`attnkit.runs.export`); this module only reads the flags.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a run as a Hugging Face folder (from_pretrained gives the same logits)")
    p.add_argument("run_path", metavar="RUN", help="a run folder (its newest checkpoint) or one checkpoint folder")
    p.add_argument("--hf", required=True, metavar="OUT", help="the Hugging Face folder to write (absent or empty)")
    p.add_argument("--family", help="the transformers family to write: a registered family (gpt2, llama, mistral, "
                                    "qwen2, bert, ...; default: the run's own, else the first that fits)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier Hugging Face folder at OUT")
    p.set_defaults(run=run)


def run(args) -> int:
    from attnkit.runs.export import export_run

    print(export_run(args.run_path, args.hf, family=args.family, overwrite=args.overwrite).describe())
    return 0
