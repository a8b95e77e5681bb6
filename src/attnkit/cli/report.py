"""``attnkit report``: write the self-contained HTML attention report of a model on a text.

    attnkit report runs/demo --text "To be, or not to be"     # a trained run: + loss curves, monitor verdicts
    attnkit report tiny --text "hello" --out tiny.html        # a preset with fresh weights
    attnkit report path/to/hf_model --text "Attention is all you need."   # a Hugging Face folder (eager weights)

Targets are those of ``attnkit doctor`` (presets, run or checkpoint folders, Hugging Face folders, hf-*-tiny).
The page opens from disk with no network; the command prints what the page shows (every weight, or past
``--dense-max`` the top-k of each row with the mass left out), where the time went (loading, the doctor, the
attention and the page) and the file's path and size. Inputs past ``--max-tokens`` (2048) are refused before
anything runs: the report holds 4 L^2 bytes per head and layer.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps."


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML explorer of a model's attention on a text")
    p.add_argument("target", help="a preset (tiny), an attnkit run/checkpoint folder, a Hugging Face folder, or "
                                  "hf-gpt2-tiny / hf-llama-tiny / hf-bert-tiny")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the input to look at")
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
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out that is not an attnkit report")
    p.set_defaults(run=run)


def run(args) -> int:
    import time

    import torch

    from attnkit.diagnostics.report import MAX_TOKENS, check_length, report, shown, tokenize
    from attnkit.diagnostics.report.encode import human_bytes
    from attnkit.runs import locate, open_source

    target = locate(args.target)
    metrics = target.metrics
    out = args.out or default_out(target)
    check_out(out, args.overwrite)  # before the model loads: a typo costs nothing
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    source = open_source(target, encoder=args.encoder)
    model, fresh = source.model, source.fresh
    title = args.title or f"attnkit report: {args.target}"
    max_tokens = MAX_TOKENS if args.max_tokens is None else args.max_tokens
    ids, labels = tokenize(model, args.text, source.saved_hf_tokenizer) if args.text else (args.text, None)
    if args.text:
        check_length(ids.shape[1], max_tokens)  # before the doctor runs
    loaded = time.perf_counter()
    doctor, doctor_s = False, 0.0
    if not args.no_doctor:
        from attnkit.cli.doctor import progress_printer
        from attnkit.diagnostics.doctor import examine

        doctor = examine(model, fresh=fresh, name=title, loaded_from=args.target if source.loaded else None,
                         text=ids if args.text else None, text_note=f"the report's text, {ids.shape[1]} tokens",
                         progress=progress_printer()).to_dict()
        doctor_s = time.perf_counter() - loaded
    path = report(model, ids, labels=labels, out=out, doctor=doctor, fresh=fresh, metrics=metrics, title=title,
                  dense_max=args.dense_max, top_k=args.top_k,
                  max_tokens=max_tokens)
    done = time.perf_counter()
    print(f"shown: {shown(ids.shape[1], args.dense_max, args.top_k)}")
    print(f"time: {done - start:.1f} s (loading {loaded - start:.1f} s, "
          + (f"doctor {doctor_s:.1f} s (--no-doctor leaves it out), " if doctor else "")
          + f"attention and page {done - loaded - doctor_s:.1f} s)")
    print(f"wrote {path} ({human_bytes(path.stat().st_size)}); open it in a browser: {path.resolve().as_uri()}")
    return 0


def default_out(target) -> Path:
    """``report.html`` in a trained run's folder; ``report-step_N.html`` beside the checkpoint of a run (in the run
    folder: a checkpoint folder is deleted with everything in it when it is pruned); else
    ``attention_report.html`` here."""
    run_dir = target.run_dir
    if run_dir is None or target.metrics is None:
        return Path("attention_report.html")
    return run_dir / ("report.html" if target.kind == "run" else f"report-{target.path.name}.html")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that would destroy something: a folder, a name without ``.html``, or an existing file
    that is not an attnkit report (a model's weights, a config) unless ``overwrite``. An earlier report is
    replaced."""
    from attnkit.diagnostics.report.page import CSP
    from attnkit.errors import AttnkitValueError

    if out.is_dir():
        raise AttnkitValueError(f"--out {str(out)!r} is a folder; give a file name such as {str(out / 'report.html')!r}.")
    if out.suffix.lower() not in (".html", ".htm"):
        raise AttnkitValueError(f"--out {str(out)!r} does not end in .html; the report is an HTML page: use e.g. "
                                f"{str(out.with_suffix('.html'))!r}.")
    if out.exists() and not overwrite:
        with open(out, "rb") as f:
            head = f.read(4096)
        if f'content="{CSP}"'.encode() not in head:
            raise AttnkitValueError(f"--out {str(out)!r} exists and is not an attnkit report; pick another --out, or "
                                    "pass --overwrite to replace it.")
