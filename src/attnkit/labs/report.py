"""Claims with pass bands fixed in code, verdicts, and the files every lab writes.

A :class:`Claim` is the tutorial's sentence, its pass band in words, and ``judge(m) -> (measured, parts)``: the
measured numbers as text and one boolean per part of the band. ``needs(m)``, when given, checks the evidence the
claim rests on first (e.g. that the reference model learned something): a ``ValueError`` there makes the claim
"not measured" with its message, never a verdict on an untrained model. The verdict follows from the parts alone:
all hold -> ``holds``; none -> ``does not hold at this scale``; some -> ``mixed``. Claims are module-level
constants in each lab, written before any number is measured; nothing here reads a result to choose a band.

Each run writes ``results.json`` (sizes, measurements, verdicts, seconds), ``summary.md`` (the claim table)
and the lab's PNG plots into its output folder. :func:`check_out_folder` applies the run-folder rules to that
folder before anything runs: absent or empty, or an earlier output of the same lab (recognised positively: its
``results.json`` names the lab and the folder holds nothing but ``results.json``, ``summary.md`` and PNGs);
anything else is refused unless ``overwrite``, and even then only the lab's own files are replaced.

Every file a lab writes follows the rules of :mod:`attnkit._files`, as every other command's outputs do: written
atomically (a temporary file renamed over the name), so a symbolic link at one of the lab's names is replaced,
never written through (its target untouched), and a FIFO, a device or a folder at one of them is refused before
the lab runs (a write would block forever or land elsewhere). Nothing in ``attnkit.labs`` opens a file for writing
itself (``tests/labs/test_lab_files.py`` scans for it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from attnkit._files import OutputKind, check_out, not_ours, write_atomic
from attnkit.errors import AttnkitValueError

#: the files a lab writes into its folder (plus its PNG plots)
OUTPUT_FILES = ("results.json", "summary.md")
#: what each of them is (:class:`attnkit._files.OutputKind`: a name, its suffix, the marker of one attnkit wrote)
RESULTS = OutputKind("lab results", (".json",), "a JSON file", b'"lab": ')
SUMMARY = OutputKind("lab summary", (".md",), "a Markdown page", b"# lab `")


def output_kind(name: str) -> OutputKind:
    """The kind of the lab output called ``name`` (``results.json``, ``summary.md``, ``NAME.png``)."""
    from attnkit.diagnostics.viz import PNG

    return {"results.json": RESULTS, "summary.md": SUMMARY}.get(name, PNG)

HOLDS, FAILS, MIXED = "holds", "does not hold at this scale", "mixed"


@dataclass(frozen=True)
class Claim:
    claim: str
    band: str
    judge: Callable[[dict], tuple[str, list[bool]]]
    needs: Callable[[dict], object] | None = None

    def verdict(self, measurements: dict) -> dict:
        try:
            if self.needs is not None:
                self.needs(measurements)
            measured, parts = self.judge(measurements)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # a measurement is missing
            return {"claim": self.claim, "band": self.band, "measured": f"not measured ({exc})",
                    "parts": [], "verdict": "not measured"}
        parts = [bool(p) for p in parts]
        if not parts:  # nothing fell inside the band's scope: no verdict rather than a vacuous "holds"
            return {"claim": self.claim, "band": self.band, "measured": measured, "parts": [],
                    "verdict": "not measured"}
        verdict = HOLDS if all(parts) else FAILS if not any(parts) else MIXED
        return {"claim": self.claim, "band": self.band, "measured": measured, "parts": parts, "verdict": verdict}


@dataclass
class Plots:
    """Where a lab saves its figures (small PNGs)."""

    out: Path
    files: list[str] = field(default_factory=list)

    @contextmanager
    def figure(self, name: str, title: str, *, ncols: int = 1, size: tuple[float, float] | None = None):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, ncols, figsize=size or (4.6 * ncols, 3.4), squeeze=False)
        fig.suptitle(title, fontsize=10)
        try:
            yield axes[0] if ncols > 1 else axes[0][0]
            fig.tight_layout()
            from attnkit.diagnostics.viz import save_png

            # the folder was checked before the lab ran (check_out_folder): an earlier figure is replaced,
            # a link at the name too (never its target), atomically
            path = save_png(fig, self.out / f"{name}.png", overwrite=True, dpi=80, option="out")
            self.files.append(path.name)
        finally:
            plt.close(fig)


def timed_at_size(value: int, smallest: int, what: str) -> int:
    """The evidence check (``Claim.needs``) of a speed claim: its timings count only at a size where the work,
    not the per-call overhead, is what was timed. Below ``smallest`` a ``ValueError`` makes the claim "not
    measured" (never "does not hold" on a timing of overhead, as ``--quick`` sizes would give)."""
    if value < smallest:
        raise ValueError(f"speed not measured at this size: {what} {value} < {smallest}; run the default size "
                         "(not the quick one)")
    return value


def fmt(x, digits: int = 3) -> str:
    """A number for a table (strings pass through)."""
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def summary_markdown(name: str, title: str, size: str, verdicts: list[dict], notes: list[str], figures: list[str],
                     seconds: float, command: str) -> str:
    lines = [f"# lab `{name}`: {title}", "", f"`{command}` ({size} size, {seconds:.0f} s on this machine)", "",
             "| claim | pass band (fixed in code before the run) | what we measured | verdict |",
             "|---|---|---|---|"]
    for v in verdicts:
        cells = [v["claim"], v["band"], v["measured"], f"**{v['verdict']}**"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    if figures:
        lines += ["", *[f"![{f}]({f})" for f in figures]]
    return "\n".join(lines) + "\n"


def not_a_lab_output(folder: Path, name: str) -> str | None:
    """Why the non-empty ``folder`` is not an earlier output of the lab ``name`` (None when it is one)."""
    why, payload = not_ours(folder, lambda entry: entry in OUTPUT_FILES or entry.endswith(".png"), "a lab",
                            "results.json")
    if why:
        return why
    if not isinstance(payload, dict) or payload.get("lab") != name:
        found = payload.get("lab") if isinstance(payload, dict) else None
        return f"its results.json is not lab {name!r}'s (lab: {found!r})"
    return None


def check_out_folder(out: Path, name: str, overwrite: bool = False, *, option: str = "out") -> Path:
    """``out`` when the lab ``name`` may write there (absent, empty, or its own earlier output), else a typed
    error naming the folder, what it holds and the fix; ``overwrite`` allows any folder (nothing is deleted: the
    lab's files are written over, other files stay) but not a FIFO, device or folder at one of the lab's file
    names. ``option``: how the messages name the folder's argument (``--out`` on the command line)."""
    if out.exists() and not out.is_dir():
        raise AttnkitValueError(f"out={str(out)!r} is a file; pass a folder (absent, empty, or an earlier output "
                                f"of lab {name!r}).")
    if not out.is_dir() or not any(out.iterdir()):
        return out
    if overwrite:  # the lab's own names: a link is replaced, a FIFO, a device or a folder refused, before it runs
        for entry in sorted(out.iterdir()):
            if entry.name in OUTPUT_FILES or entry.name.endswith(".png"):
                check_out(entry, output_kind(entry.name), overwrite=True, option=option)
        return out
    why = not_a_lab_output(out, name)
    if why is not None:
        raise AttnkitValueError(f"out={str(out)!r} is not empty and is not an earlier output of lab {name!r}: {why}; "
                                "pick an empty or new out=, or pass overwrite=True to write the lab's "
                                "files into it anyway (nothing else there is deleted).")
    return out


def write_outputs(out: Path, payload: dict, summary: str) -> None:
    """``results.json`` and ``summary.md`` into ``out``, each atomically by the rules of :mod:`attnkit._files`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(jsonable(payload), indent=1)), ("summary.md", summary)):
        path = check_out(out / name, output_kind(name), overwrite=True, option="out")
        write_atomic(path, text.encode("utf-8"), output_kind(name))
