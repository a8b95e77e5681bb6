"""Bad arguments of lab, bench, generate and masks are one typed line naming the flag, exit 2 (issue 21 item 19c):
``lab --threads 100000`` used to segfault, ``bench --name ../..`` wrote outside the results folder, ``generate
--device`` gave tracebacks and ``masks --size -3`` blamed ``q_positions``."""

import os

import pytest

from attnkit.bench.common import write_results
from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError

CPUS = os.cpu_count() or 1


@pytest.mark.parametrize(("args", "words"), [
    (["lab", "positions", "--quick", "--threads", "100000"],
     f"threads must be an int from 1 to this machine's {CPUS} CPUs, got 100000"),
    (["lab", "positions", "--quick", "--threads", "0"], "threads must be >= 1, got 0"),
    (["bench", "attention", "--name", "../..", "--n", "8"], "--name '../..' must be a plain file name"),
    (["bench", "attention", "--name", "/tmp/x", "--n", "8"], "--name '/tmp/x' must be a plain file name"),
    (["bench", "attention", "--repeats", "0"], "--repeats must be > 0 (a size, a count or a budget), got 0"),
    (["bench", "attention", "--n", "64", "-5"], "--n must be > 0 (a size, a count or a budget), got -5"),
    (["bench", "cp", "--budget-mib", "nan"], "--budget-mib must be > 0 (a size, a count or a budget), got nan"),
    (["bench", "cp", "--threads", "100000"], f"--threads 100000 is more than this machine's {CPUS} CPUs"),
    (["generate", "tiny", "--prompt", "x", "--device", "foo"],
     "device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (or 'mps'), got 'foo'; pass --device cpu"),
    (["masks", "causal()", "--size", "-3"], "--size must be a length >= 1 (the rows and columns to draw), got -3"),
    (["masks", "causal()", "--size", "0"], "--size must be a length >= 1"),
])
def test_a_bad_argument_is_one_line_naming_it(args, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert words in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_generate_on_a_device_this_machine_lacks_says_so(device, capsys):
    import torch

    available = torch.cuda.is_available() if device == "cuda" else torch.backends.mps.is_available()
    if available:
        pytest.skip(f"{device} is available here")
    assert main(["generate", "tiny", "--prompt", "x", "--device", device]) == 2
    err = capsys.readouterr().err
    assert f"--device {device}: " in err and "is not available here" in err and "Traceback" not in err


def test_results_never_leave_the_results_folder(tmp_path):
    with pytest.raises(AttnkitValueError, match=r"--name '\.\./escape' must be a plain file name"):
        write_results("../escape", {}, tmp_path / "results")
    assert not (tmp_path / "escape.json").exists()


def test_a_mask_picture_names_its_own_arguments():
    from attnkit.masks import causal

    with pytest.raises(AttnkitValueError, match=r"picture: q_len must be an int >= 1 \(the rows or columns to draw\), "
                                                r"got -3"):
        causal().picture(-3, -3)
