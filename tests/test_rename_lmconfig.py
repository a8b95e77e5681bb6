"""scripts/rename_lmconfig.py (issue 20.5): it renames LMConfig's fields and nothing else, and rerunning it changes
nothing. The before/after sources live in tests/data/*.txt so that the script, which rewrites .py and .md files,
never rewrites its own fixtures."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location("rename_lmconfig", ROOT / "scripts" / "rename_lmconfig.py")
rename = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rename)


def test_the_script_renames_only_lmconfig_fields_and_is_idempotent():
    before, after = ((DATA / f"rename_lmconfig_{name}.txt").read_text() for name in ("before", "after"))
    notes = []
    out = rename.rename_python(before, Path("before.py"), notes)
    assert out == after and notes == []
    assert rename.rename_python(out, Path("after.py"), notes) == out and notes == []


def test_a_renamed_keyword_to_an_unknown_callee_is_reported_not_changed():
    source = "make_thing(n_heads=4)\n"  # rename-lmconfig: skip
    notes = []
    assert rename.rename_python(source, Path("x.py"), notes) == source
    assert len(notes) == 1 and "not in CONFIG_CALLS" in notes[0]


def test_markdown_renames_the_words_and_dim_in_builder_calls_only():
    text = 'build_lm("nano", dim=32, n_kv_heads=1)\ntorch.softmax(x, dim=-1); `n_layers`\n'  # rename-lmconfig: skip
    assert rename.rename_markdown(text) == \
        'build_lm("nano", embed_dim=32, num_kv_heads=1)\ntorch.softmax(x, dim=-1); `num_layers`\n'
