"""``attnkit report``: write the self-contained HTML attention report of a model on a text.

    attnkit report runs/demo --text "To be, or not to be"     # a trained run: + loss curves, monitor verdicts
    attnkit report tiny --text "hello" --out tiny.html        # a preset with fresh weights
    attnkit report path/to/hf_model --text "Attention is all you need."   # a Hugging Face folder (eager weights)
    attnkit report path/to/saved_config_model --ids --text "5 9 12 5 9 12"  # a folder without a tokenizer
    attnkit report runs/demo --text "def forward(self" --generate 32      # + where each generated token looked

Targets are those of ``attnkit doctor`` (presets, run or checkpoint folders, Hugging Face folders, hf-*-tiny).
The page opens from disk with no network; the command prints what the page shows (every weight, or past
``--dense-max`` the top-k of each row with the mass left out), where the time went (loading, the doctor, the
attention and the page) and the file's path and size. Inputs past ``--max-tokens`` (2048) are refused before
anything runs: the report holds 4 L^2 bytes per head and layer.
"""

from __future__ import annotations

from pathlib import Path

from attnkit.cli.flags import as_typed

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps."


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML explorer of a model's attention on a text")
    p.add_argument("target", help="a preset (tiny), an attnkit run/checkpoint folder, a Hugging Face folder, or "
                                  "hf-gpt2-tiny / hf-llama-tiny / hf-bert-tiny")
    p.add_argument("--text", default=None, help=f"the input to look at (default {DEFAULT_TEXT!r})")
    p.add_argument("--ids", action="store_true",
                   help="--text is token ids (\"1 5 7\"), for a model without a tokenizer (a save_pretrained folder)")
    p.add_argument("--out", type=Path, default=None,
                   help="the .html to write (default: report.html in a run folder, report-step_N.html there for one of "
                        "its checkpoints, else attention_report.html)")
    p.add_argument("--title", default=None, help="the page title (default: attnkit report: TARGET)")
    p.add_argument("--encoder", action="store_true", help="build the preset as a bidirectional encoder")
    p.add_argument("--no-doctor", action="store_true", help="leave the doctor's checks out (faster)")
    p.add_argument("--dense-max", type=int, default=512, help="longer inputs keep only the top-k weights per row")
    p.add_argument("--top-k", type=int, default=32, help="weights kept per row past --dense-max")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="longer inputs are refused (default 2048: the report holds 4 L^2 bytes per head and layer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out that is not an attnkit report, or a symbolic link (never its target)")
    p.add_argument("--compare", default=None, metavar="CKPT",
                   help="a second checkpoint of the same model (e.g. an earlier step of the run): the page shows its "
                        "attention beside the target's, head by head")
    p.add_argument("--heads", choices=["zero", "mean"], default=None, metavar="ABLATION",
                   help="add the head-importance panel: each head removed in turn (zero or mean ablation), the loss "
                        "change on the text (as `attnkit heads`; one forward per head)")
    p.add_argument("--generate", type=int, default=None, metavar="N",
                   help="continue the text greedily for N tokens and show, for each new token, which earlier tokens "
                        "it attended to in every layer and head (a causal LM)")
    p.set_defaults(run=run)


def run(args) -> int:
    import time

    import torch

    from attnkit._files import check_text
    from attnkit.diagnostics.report import MAX_TOKENS, check_length, check_out, labeler, report, shown
    from attnkit.diagnostics.report.encode import human_bytes
    from attnkit.errors import AttnkitValueError
    from attnkit.runs import locate, open_source

    for flag in ("target", "text", "title", "compare", "out"):  # undecodable bytes: one typed line, no traceback
        if getattr(args, flag) is not None:
            check_text(f"--{flag}" if flag != "target" else "TARGET", str(getattr(args, flag)))
    check_ids_text(args)
    if args.generate is not None and args.generate < 1:
        raise AttnkitValueError(f"--generate must be >= 1 (new tokens to follow the text), got {args.generate}.")
    target = locate(args.target)
    if args.compare is not None:  # before the model loads and the doctor runs: a missing checkpoint costs nothing
        locate(args.compare, name="--compare")
    metrics = target.metrics
    out = args.out or default_out(target)
    check_out(out, args.overwrite)  # the library's rules, before the model loads: a typo costs nothing
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    source = open_source(target, encoder=args.encoder)
    model, fresh = source.model, source.fresh
    title = args.title or f"attnkit report: {args.target}"
    max_tokens = MAX_TOKENS if args.max_tokens is None else args.max_tokens
    ids, labels = cli_tokens(args, source) if args.text != "" else (args.text, None)
    if args.text != "":
        check_length(ids.shape[1], max_tokens)  # before the doctor runs
    loaded = time.perf_counter()
    doctor, doctor_s = False, 0.0
    if not args.no_doctor:
        from attnkit.cli.doctor import progress_printer
        from attnkit.diagnostics.doctor import examine

        doctor = examine(model, fresh=fresh, name=title, loaded_from=args.target if source.loaded else None,
                         text=ids if args.text != "" else None, text_note=f"the report's text, {ids.shape[1]} tokens",
                         progress=progress_printer()).to_dict()
        doctor_s = time.perf_counter() - loaded
    compare, importance, extra_s = _extras(args, model, ids)
    path = report(model, ids, labels=labels, out=out, overwrite=args.overwrite, doctor=doctor, fresh=fresh,
                  metrics=metrics, title=title, dense_max=args.dense_max, top_k=args.top_k, max_tokens=max_tokens,
                  compare=compare, names=(args.target, args.compare or "compare"), head_importance=importance,
                  generate=args.generate, label_of=labeler(model, source.hf_tokenizer, not args.ids))
    done = time.perf_counter()
    print(f"shown: {as_typed(shown(ids.shape[1], args.dense_max, args.top_k))}")
    print(f"time: {done - start:.1f} s (loading {loaded - start:.1f} s, "
          + (f"doctor {doctor_s:.1f} s (--no-doctor leaves it out), " if doctor else "")
          + (f"compare and heads {extra_s:.1f} s, " if extra_s else "")
          + f"attention and page {done - loaded - doctor_s - extra_s:.1f} s)")
    print(f"wrote {path} ({human_bytes(path.stat().st_size)}); open it in a browser: {path.resolve().as_uri()}")
    return 0


def check_ids_text(args) -> None:
    """``--ids`` reads --text as token ids: it needs one (the default text is words). Before anything loads."""
    from attnkit.errors import AttnkitValueError

    if args.ids and args.text is None:
        raise AttnkitValueError("--ids reads --text as token ids: pass them, e.g. --ids --text \"1 5 7 1 5 7\".")


def cli_tokens(args, source):
    """``(tokens (1, L), labels)`` of ``--text`` for ``report`` and ``heads``: token ids with ``--ids``, else the
    target's tokenizer; a model without one is told about ``--ids``."""
    from attnkit.diagnostics.report import tokenize
    from attnkit.errors import AttnkitValueError
    from attnkit.integrations.remote_code import RemoteCodeRefused

    model = source.model
    if args.ids:
        return token_ids(args.text, getattr(getattr(model, "config", None), "vocab_size", None))
    text = DEFAULT_TEXT if args.text is None else args.text
    try:
        return tokenize(model, text, source.hf_tokenizer)
    except RemoteCodeRefused:
        raise  # a tokenizer that asks to run the folder's code is refused by name (its message says what to do)
    except AttnkitValueError as exc:
        if not str(exc).startswith(("no tokenizer found", "text needs a tokenizer")):
            raise  # a refused tokenizer (its folder's code) says so itself
        raise AttnkitValueError(f"{args.target} has no tokenizer to read --text with; pass token ids instead: "
                                "--ids --text \"1 5 7\".") from exc


def token_ids(text: str, vocab_size: int | None = None, option: str = "--text") -> tuple:
    """``(tokens (1, L) int64 tensor, labels)`` from token ids written as text (``"1 5 7"``, commas allowed), for a model
    without a tokenizer (``--ids`` of ``report``, ``heads`` and ``generate``); each id is checked against
    ``vocab_size``. The labels are the ids."""
    import torch

    from attnkit.errors import AttnkitValueError

    try:
        ids = [int(t) for t in str(text).replace(",", " ").split()]
    except ValueError:
        raise AttnkitValueError(f"--ids: {option} {text!r} is not token ids; pass ids separated by spaces, e.g. "
                                f"{option} \"1 5 7\".") from None
    if not ids:
        raise AttnkitValueError(f"--ids: {option} holds no token ids; pass ids separated by spaces, e.g. "
                                f"{option} \"1 5 7\".")
    bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        raise AttnkitValueError(f"--ids: {option} holds id {bad[0]}, outside the model's vocabulary "
                                f"[0, {vocab_size}); pass ids in that range.")
    return torch.tensor([ids]), [str(i) for i in ids]


def default_out(target) -> Path:
    """``report.html`` in a trained run's folder; ``report-step_N.html`` beside the checkpoint of a run (in the run
    folder: a checkpoint folder is deleted with everything in it when it is pruned); else
    ``attention_report.html`` here."""
    run_dir = target.run_dir
    if run_dir is None or target.metrics is None:
        return Path("attention_report.html")
    return run_dir / ("report.html" if target.kind == "run" else f"report-{target.path.name}.html")


def _extras(args, model, ids):
    """``(compare model or None, head importance or None, seconds)``: what ``--compare`` and ``--heads`` add."""
    import time

    import torch

    from attnkit.runs import open_source

    start, compare, importance = time.perf_counter(), None, None
    if args.compare is not None:
        torch.manual_seed(args.seed)
        compare = open_source(args.compare, encoder=args.encoder).model
    if args.heads is not None:
        from attnkit.diagnostics.importance import head_importance

        importance = head_importance(model, ids, ablation=args.heads)
    return compare, importance, (time.perf_counter() - start if compare is not None or importance is not None else 0.0)
