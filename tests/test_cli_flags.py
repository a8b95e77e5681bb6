"""Issue 20 item 4: the library's messages name Python arguments (``run_dir=``, ``overwrite=True``); the command
line shows the flag the user typed (``--run-dir``, ``--overwrite``), translated in one place, ``attnkit.cli.flags``."""

from __future__ import annotations

import pytest

from attnkit.cli.flags import as_typed, flag
from attnkit.cli.main import main
from attnkit.diagnostics.monitor import monitor_hook
from attnkit.errors import AttnkitValueError
from attnkit.runs.convert import convert_folder
from attnkit.runs.folder import RunFolder, RunFolderError
from attnkit.training.dist import pick_device


def _stopped_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")  # a run stopped before its first checkpoint
    return run


# ------------------------------------------------------------------------------------- the library: Python names
def test_a_run_folder_refusal_names_run_dir_and_overwrite(tmp_path):
    run = _stopped_run(tmp_path)
    with pytest.raises(RunFolderError) as info:
        RunFolder(run).check_fresh(overwrite=False)
    message = str(info.value)
    assert message.startswith(f"run_dir={str(run)!r} holds a run that has no checkpoint")
    assert "pick another run_dir=, or pass overwrite=True to replace it." in message and "--" not in message


def test_a_device_refusal_names_device(tmp_path):
    with pytest.raises(AttnkitValueError, match=r"got 'foo'; pass device='cpu' or device='auto'\.$") as info:
        pick_device("foo")
    assert "--" not in str(info.value)


def test_a_convert_refusal_names_path(tmp_path):
    with pytest.raises(AttnkitValueError, match=r"^path='.*missing' is not a Hugging Face model folder") as info:
        convert_folder(tmp_path / "missing", tmp_path / "out")
    assert "--" not in str(info.value)


def test_the_monitor_refusal_names_its_argument():
    with pytest.raises(AttnkitValueError, match=r"e\.g\. monitor=100\.") as info:
        monitor_hook(0)
    assert "--" not in str(info.value)


# ------------------------------------------------------------------------------------- the translation
@pytest.mark.parametrize("python, typed", [
    ("run_dir='/a b/run' holds a run; pick another run_dir=, or pass overwrite=True to replace it.",
     "--run-dir '/a b/run' holds a run; pick another --run-dir, or pass --overwrite to replace it."),
    ("device='cuda': CUDA is not available here; use device='cpu' or device='auto'.",
     "--device cuda: CUDA is not available here; use --device cpu or --device auto."),
    ("keeps only its newest checkpoints (keep=); start a new run from it with init_from=",
     "keeps only its newest checkpoints (--keep); start a new run from it with --init-from"),
    ("e.g. monitor=100, max_tokens=900, doctor=False", "e.g. --monitor 100, --max-tokens 900, --no-doctor"),
    # a path the user typed is never rewritten, nor a word that is only part of one
    ("out='runs/out=1/run_dir=x' exists; the run's data and out are kept", "--out 'runs/out=1/run_dir=x' exists; "
     "the run's data and out are kept"),
])
def test_as_typed_writes_the_flag(python, typed):
    assert as_typed(python) == typed


def test_a_command_names_its_own_flag():
    assert flag("path", "convert") == "--hf" and flag("path") == "--path" and flag("seq_len") == "--seq-len"
    assert as_typed("path='x' is not a Hugging Face model folder", "convert") == \
        "--hf 'x' is not a Hugging Face model folder"


# ------------------------------------------------------------------------------------- the command line: flags
def test_the_command_line_names_the_flag(tmp_path, capsys):
    run = _stopped_run(tmp_path)
    assert main(["train", "--run-dir", str(run), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"attnkit train: error: --run-dir {str(run)!r} holds a run that has no checkpoint" in err, err
    assert "pick another --run-dir, or pass --overwrite to replace it." in err and "run_dir=" not in err
