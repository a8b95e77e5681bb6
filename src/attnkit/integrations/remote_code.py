"""Never run a model folder's code: a Hugging Face folder's ``config.json`` is read and checked here, before
transformers sees the folder (no transformers import, so anything may call it).
"""

from __future__ import annotations

from pathlib import Path

from attnkit.errors import AttnkitValueError


class RemoteCodeRefused(AttnkitValueError):
    """A Hugging Face folder whose config asks to run its own Python code (``auto_map``): never executed."""


def read_config(folder: Path) -> dict:
    """The folder's ``config.json`` as a dict, refusing a folder with custom modelling code (``auto_map``) before
    transformers sees it: attnkit never runs a model folder's Python code."""
    import json

    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raw = None
    if not isinstance(raw, dict):
        raise AttnkitValueError(f"{str(folder / 'config.json')!r} is not a JSON object; a Hugging Face folder needs a "
                                "config.json written by save_pretrained.")
    if raw.get("auto_map"):
        raise RemoteCodeRefused(
            f"{str(folder)!r} is a Hugging Face model with custom code (config.json has auto_map "
            f"{_shown(raw['auto_map'])}); attnkit never runs a model folder's Python code. Load it from your own "
            "Python session after reviewing the code, then pass the model object (e.g. ak.doctor.examine(model)).")
    return raw


def _shown(auto_map) -> str:
    """``auto_map`` as a message shows it: a mapping's keys (the classes it replaces), anything else as written."""
    return repr(sorted(map(str, auto_map))) if isinstance(auto_map, dict) else repr(auto_map)[:80]


def check_tokenizer(folder: Path) -> None:
    """Refuse a tokenizer that asks to run the folder's own Python (``auto_map`` in ``tokenizer_config.json`` or in
    ``config.json``) before transformers sees the folder: no prompt, nothing runs."""
    import json

    for name in ("tokenizer_config.json", "config.json"):
        try:
            raw = json.loads((Path(folder) / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # absent or unreadable: transformers' own loader judges it (it runs no code without auto_map)
        if isinstance(raw, dict) and raw.get("auto_map"):
            raise RemoteCodeRefused(
                f"the tokenizer in {str(folder)!r} asks to run the folder's own Python code ({name} has auto_map "
                f"{_shown(raw['auto_map'])}); attnkit never "
                "runs a model folder's code. Load the tokenizer in your own Python session after reviewing the code, "
                "or pass token ids instead of text.")
