"""``attnkit doctor``: run the attention doctor on a preset, a checkpoint or a Hugging Face model.

    attnkit doctor tiny                      # a fresh attnkit model from a preset
    attnkit doctor runs/demo --json          # a trained checkpoint, the report as JSON
    attnkit doctor hf-gpt2-tiny              # GPT-2 from a small config (also hf-llama-tiny, hf-bert-tiny)
    attnkit doctor path/to/hf_model --overfit

The exit code is 1 when a check fails, 0 otherwise.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check a model for the classic attention bugs (leaks, cache, scale, masks, NaN)")
    p.add_argument("target", help="a preset (tiny), an attnkit run/checkpoint folder, a Hugging Face folder, or "
                                  "hf-gpt2-tiny / hf-llama-tiny / hf-bert-tiny")
    p.add_argument("--encoder", action="store_true", help="build the preset as a bidirectional encoder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--overfit", action="store_true", help="also train a copy on 10 samples (slower)")
    p.add_argument("--checks", nargs="+", default=None, help="run only these checks")
    p.add_argument("--skip", nargs="+", default=(), help="leave these checks out")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit.diagnostics.doctor import examine
    from attnkit.runs import open_source

    torch.manual_seed(args.seed)
    source = open_source(args.target, encoder=args.encoder)
    report = examine(source.model, checks=args.checks, skip=args.skip, fresh=source.fresh, overfit=args.overfit,
                     seed=args.seed, name=args.target)
    print(report.to_json() if args.json else report)
    return report.exit_code
