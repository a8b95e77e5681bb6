"""issue 33 item 6: a folder spelled like a preset is never silently shadowed by it; issue 31: every command opens
the same hf-*-tiny model; attnkit's own runs need no transformers for `heads` and `report --heads`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError
from attnkit.runs import locate, open_source
from attnkit.runs.source import check_folder_name, target_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train_helpers import small_config  # noqa: E402

from attnkit.training import train  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def nano_run(tmp_path_factory):
    """A real run in a folder literally named ``nano`` (the case of the issue), written as a path (./nano)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    here = tmp_path_factory.mktemp("shadow")
    cwd = os.getcwd()
    try:
        os.chdir(here)
        train(small_config("./nano", steps=2, ckpt_every=2), log=lambda *a, **k: None)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return here


def test_train_refuses_a_run_dir_spelled_like_a_preset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "nano", "--steps", "1", "--run-dir", "nano"]) == 2
    err = capsys.readouterr().err
    assert "is also the name of a preset" in err and "runs/nano" in err
    assert not (tmp_path / "nano").exists()  # refused before anything is written
    for name in target_names():
        with pytest.raises(AttnkitValueError, match="is also the name of a"):
            check_folder_name(name, "run_dir")
    check_folder_name("runs/nano", "run_dir")  # a path is fine
    check_folder_name("./nano", "run_dir")


def test_convert_refuses_an_out_spelled_like_a_preset(tmp_path, monkeypatch):
    from attnkit.runs.convert import convert_folder

    monkeypatch.chdir(tmp_path)
    with pytest.raises(AttnkitValueError, match="is also the name of a preset"):
        convert_folder("hf-llama-tiny", "tiny")
    assert not (tmp_path / "tiny").exists()


def test_a_folder_named_like_a_preset_is_refused_as_ambiguous_never_opened_as_the_preset(nano_run, monkeypatch,
                                                                                          capsys):
    monkeypatch.chdir(nano_run)
    with pytest.raises(AttnkitValueError, match=r"names both the preset nano and the model folder \./nano"):
        locate("nano")
    assert locate("./nano").kind == "run"  # the path spelling opens the folder
    assert open_source("./nano").loaded is True
    for command in (["generate", "nano", "--prompt", "a"], ["report", "nano", "--no-doctor"],
                    ["doctor", "nano", "--checks", "causal-leak"], ["heads", "nano"]):
        assert main(command) == 2, command
        assert "write ./nano for the folder" in capsys.readouterr().err, command
    monkeypatch.chdir(nano_run / "nano")  # elsewhere the name is the preset again
    assert locate("nano").kind == "preset"


def test_every_command_opens_the_same_hf_tiny_model():
    """convert used to draw hf-*-tiny from an unseeded RNG: another model than doctor/generate opened."""
    pytest.importorskip("transformers")
    from attnkit.runs.source import hf_tiny

    torch.manual_seed(1)
    a = hf_tiny("hf-llama-tiny")
    torch.manual_seed(2)
    b = open_source("hf-llama-tiny").model
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    torch.manual_seed(1)
    state = torch.random.get_rng_state()
    _ = hf_tiny("hf-llama-tiny")
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG untouched


def test_convert_of_hf_tiny_holds_the_model_doctor_opens(tmp_path):
    pytest.importorskip("transformers")
    from attnkit.integrations.hf.convert import from_hf
    from attnkit.runs.convert import convert_folder

    torch.manual_seed(5)
    convert_folder("hf-llama-tiny", tmp_path / "t", log=lambda *a: None)
    torch.manual_seed(9)
    expected = from_hf(open_source("hf-llama-tiny").model)
    got = open_source(str(tmp_path / "t")).model
    for (name, x), y in zip(expected.state_dict().items(), got.state_dict().values()):
        assert torch.equal(x, y), name


BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _Block())
from attnkit.cli.main import main
code = main(sys.argv[1:])
assert "transformers" not in sys.modules, "transformers was imported"
sys.exit(code)
"""


def test_heads_and_report_heads_on_a_run_need_no_transformers(nano_run, tmp_path):
    """issue 31: `heads` and `report --heads` on attnkit's own runs imported transformers (a plain pip install has
    none)."""
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", ATTNKIT_PROGRESS="0")
    run = str(nano_run / "nano")
    for args in (["heads", run, "--top", "1"],
                 ["report", run, "--heads", "zero", "--no-doctor", "--out", str(tmp_path / "r.html")]):
        done = subprocess.run([sys.executable, "-c", BLOCK, *args], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    assert (tmp_path / "r.html").stat().st_size > 1000
