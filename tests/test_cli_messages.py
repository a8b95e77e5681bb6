"""Every CLI mistake in the user's words: exit status 2, one line from the command that is running
(``attnkit CMD: error:``), naming the flag as typed and a fix that belongs to that command (issue 23 item 4)."""

import pytest

from attnkit.cli.main import main

# (args, words the message must hold, words it must not: the library's names for the same thing)
CASES = [
    (["train", "--minutes", "-1"], "--minutes must be a number of minutes > 0, got -1.0; e.g. --minutes 3",
     "time_budget"),
    (["train", "--minutes", "nan"], "--minutes must be a number of minutes > 0, got nan", "time_budget"),
    (["train", "--minutes", "2", "--steps", "5"], "--minutes 2 and --steps 5 exclude each other", None),
    (["train", "--resume", "runs/x", "--minutes", "2"], "--minutes 2 sets the length of a new run; --resume runs/x "
     "continues to the step count its checkpoint recorded (pass --steps N to extend it)", "time_budget"),
    (["train", "--steps", "0"], "--steps must be a positive int, got 0", "error: steps must"),
    (["train", "--batch-size", "0"], "--batch-size must be a positive int, got 0", "batch_size"),
    (["train", "--lr", "0"], "--lr must be > 0.0, got 0.0", None),
    (["train", "--warmup", "-1"], "--warmup must be >= 0, got -1", None),
    (["train", "--val-fraction", "2"], "--val-fraction must be in (0.0, 1.0)", "val_fraction"),
    (["train", "--seq-len", "1000", "--positions", "learned"],
     "--seq-len 1000 is longer than the 256 learned positions of the 'tiny' preset; pass --seq-len 256 or less",
     "seq_len"),
    (["generate", "nano", "--prompt", ""], "--prompt '' has no tokens; give every --prompt some text",
     "list of lists"),
    (["generate", "nano", "--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1",
     "max_new_tokens"),
    (["generate", "nano", "--prompt", "a", "--top-k", "0"], "--top-k must be >= 1, got 0", "top_k"),
    (["generate", "nano", "--prompt", "a", "--top-p", "2"], "--top-p must be in (0, 1], got 2.0", "top_p"),
    (["generate", "nano", "--prompt", "a", "--temperature", "-1"], "--temperature must be >= 0, got -1.0; 0 = "
     "greedy, e.g. --temperature 0.8", "temperature="),
    (["generate", "nano", "--prompt", "a", "--temperature", "nan"], "--temperature must be a finite number", None),
    (["generate", "nano", "--prompt", "a", "--temperature", "0", "--top-k", "5"],
     "--top-k / --top-p only apply when sampling, but --temperature 0 is greedy", "top_k="),
    (["generate", "nano", "--prompt", "a", "--prompt", "b", "--stream"], "--stream prints one prompt's tokens", None),
    (["generate", "--checkpoint", "README.md", "--prompt", "a"], "target 'README.md' is not a preset", "--resume"),
    (["report", "no-such-run"], "target 'no-such-run' is not a preset", "doctor target"),
    (["doctor", "no-such-run"], "target 'no-such-run' is not a preset", None),
    (["convert", "--hf", "no-such-folder", "--out", "out"], "--hf 'no-such-folder' is not a Hugging Face model "
     "folder (it does not exist)", None),
]


@pytest.mark.parametrize(("args", "words", "not_words"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else None)
def test_a_cli_mistake_names_the_flag_and_the_command(args, words, not_words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit {args[0]}: error: ") and words in err, err
    assert not_words is None or not_words not in err, err
    assert "Traceback" not in err and not any(tmp_path.iterdir())  # refused before anything was written


def test_convert_of_a_missing_folder_answers_before_importing_transformers(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # an import would fail: the answer must come first
    assert main(["convert", "--hf", "missing", "--out", "out"]) == 2
    assert "--hf 'missing' is not a Hugging Face model folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["convert", "--hf", "empty", "--out", "out"]) == 2
    assert "(no config.json)" in capsys.readouterr().err
