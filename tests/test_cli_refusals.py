"""Every argument is checked before expensive work, in every command (issue 31 item 3, issue 33 item 11).

The table runs each refusal with model building, the doctor and attention itself patched to raise: a refusal that
arrives only after a model is built (or a probe runs) fails here, and so does a traceback or another exit status.
"""

import argparse
import json

import pytest
import torch

from attnkit.cli import flags
from attnkit.cli.main import build_parser, main

BIG_SEED = str(2**63)
HUGE = "9" * 400
BAD = "ab\udcff"  # what a command-line argument holding the byte 0xff arrives as


class Expensive(RuntimeError):
    pass


@pytest.fixture
def nothing_expensive(monkeypatch):
    """Building any torch module, running the doctor or an attention call raises :class:`Expensive`."""

    def refuse(*args, **kwargs):
        raise Expensive("expensive work started before the arguments were checked")

    import attnkit.diagnostics.doctor as doctor

    build_parser()  # imports every command; transformers' own imports build modules at import time: done first
    try:
        import transformers

        transformers.AttentionInterface, transformers.AutoConfig  # noqa: B018 - lazy imports, resolved here
        import attnkit.integrations.hf  # noqa: F401
    except ImportError:
        pass
    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)
    monkeypatch.setattr(doctor, "examine", refuse)
    monkeypatch.setattr(attnkit, "attention", refuse)


def status(args) -> int:
    """``main(args)``'s exit status, a refusal argparse makes (SystemExit) included."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


def hf_folder(path, **fields):
    """A Hugging Face folder with only a config.json (no weights: nothing past the config may be read)."""
    path.mkdir()
    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, **fields}
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def flash_attn_missing() -> bool:
    try:
        from transformers.utils import is_flash_attn_2_available
    except ImportError:
        return True
    return not is_flash_attn_2_available()


CASES = [
    # --seed past a signed 64-bit int, in every command that takes one
    (["train", "--seed", BIG_SEED], "argument --seed: must be an int from 0 to 2**63 - 1"),
    (["generate", "tiny", "--prompt", "x", "--seed", BIG_SEED], "argument --seed: must be an int from 0"),
    (["doctor", "tiny", "--seed", BIG_SEED], "argument --seed: must be an int from 0"),
    (["report", "tiny", "--seed", BIG_SEED], "argument --seed: must be an int from 0"),
    (["heads", "tiny", "--seed", BIG_SEED], "argument --seed: must be an int from 0"),
    (["lab", "positions", "--quick", "--seed", BIG_SEED], "argument --seed: must be an int from 0"),
    (["sweep", "--seed", HUGE], "argument --seed: must be an int from 0 to 2**63 - 1 (9223372036854775807), "
     "got '99999999999999999999...(400 characters)'"),
    (["doctor", "tiny", "--seed", "-1"], "argument --seed: must be an int from 0"),
    # text that is not UTF-8
    (["heads", "tiny", "--text", BAD], "--text 'ab\\udcff' is not valid UTF-8 (byte b'\\xff' at 2"),
    (["generate", "tiny", "--prompt", BAD], "--prompt 'ab\\udcff' is not valid UTF-8 (byte b'\\xff' at 2"),
    (["doctor", BAD], "TARGET 'ab\\udcff' is not valid UTF-8"),
    # sizes past what the command draws
    (["tour", "--length", "-1"], "--length must be a sequence length from 1 to 128"),
    (["tour", "--length", "0"], "--length must be a sequence length from 1 to 128"),
    (["tour", "--length", "1000000"], "--length must be a sequence length from 1 to 128 (each mask is drawn as an "
     "L x L picture), got 1000000"),
    (["masks", "causal()", "--size", "1000000000"], "--size must be at most 4096"),
    (["masks", "padding([10000000000])"], "has data 10000000000 keys long, more than the 4096 drawn at most"),
    (["masks", "padding([3, 5])"], "padding([3, 5]): pass one length (padding(5) or padding([5])), a row of 0/1 "
     "flags"),
    # a checkpoint to compare with that does not exist: before the target loads and the doctor runs
    (["report", "tiny", "--compare", "runs/demo/checkpoints/step_00000010"],
     "--compare 'runs/demo/checkpoints/step_00000010' is not a preset"),
]


@pytest.mark.parametrize(("args", "words"), CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_refusal_arrives_before_any_model_is_built(args, words, nothing_expensive, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert status(args) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"attnkit {args[0]}: error: ") and words in first, err
    assert "Traceback" not in err and "--debug" not in err, err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("command", ["doctor", "report", "heads", "generate"])
@pytest.mark.parametrize(("fields", "words"), [
    ({"auto_map": 1}, "is a Hugging Face model with custom code (config.json has auto_map 1)"),
    ({"auto_map": {"AutoModel": "x.Y"}}, "(config.json has auto_map ['AutoModel'])"),
    ({"attn_implementation": "flash_attention_2"}, "field 'attn_implementation' is 'flash_attention_2', which needs "
     "the flash-attn package"),
    ({"attn_implementation": "kernels-community/flash-attn"}, "a kernel from the Hugging Face Hub"),
    ({"attn_implementation": 3}, "field 'attn_implementation' is 3, expected a name such as 'sdpa'"),
])
def test_a_config_json_transformers_would_crash_on_is_refused_first(command, fields, words, nothing_expensive,
                                                                     tmp_path, monkeypatch, capsys):
    if fields.get("attn_implementation") == "flash_attention_2" and not flash_attn_missing():
        pytest.skip("flash-attn is installed here")
    monkeypatch.chdir(tmp_path)
    folder = hf_folder(tmp_path / "model", **fields)
    extra = ["--ids", "--prompt", "1 2"] if command == "generate" else []
    assert status([command, folder, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit {command}: error: ") and words in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def every_parser():
    """``(command words, parser)`` for every command and sub-command of ``attnkit``."""
    found, todo = [], [((), build_parser())]
    while todo:
        words, parser = todo.pop()
        found.append((words, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                names = {}
                for name, sub in action.choices.items():
                    names.setdefault(id(sub), (name, sub))  # aliases: once
                todo += [((*words, name), sub) for name, sub in names.values()]
    return found


def test_every_seed_flag_of_every_command_is_checked_the_same_way():
    seeds = [(words, action) for words, parser in every_parser() for action in parser._actions
             if action.dest == "seed" and action.option_strings]
    assert {words[0] for words, _ in seeds} >= {"train", "generate", "doctor", "report", "heads", "lab", "sweep"}
    for words, action in seeds:
        assert action.type is flags.seed, words
    assert flags.seed(str(2**63 - 1)) == 2**63 - 1 and flags.seed("0") == 0
    for bad in (BIG_SEED, "-1", "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be an int from 0 to 2\*\*63 - 1"):
            flags.seed(bad)


def test_a_400_digit_step_in_metrics_is_skipped_and_said(tmp_path):
    from attnkit.runs.read import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + f'{{"step": {HUGE}, "loss": 1.0}}\n'
                    + f'{{"step": 3, "tokens": {HUGE}}}\n' + json.dumps({"step": 4, "loss": 1.5}) + "\n")
    said = []
    records = read_metrics(path, on_skip=said.append)
    assert [r["step"] for r in records] == [1, 4]
    assert "line 2: step is 99999999999999999999...(400 characters), not an int from 0 to 2**63 - 1" in said[0]
    assert "line 3: tokens is 99999999999999999999...(400 characters), not a number" in said[0]
    [float(r["step"]) for r in records]  # what the report's plots do with them


@pytest.mark.parametrize("length", range(1, 10))
def test_the_tour_takes_every_short_length(length, capsys):
    assert main(["tour", "--length", str(length)]) == 0
    out = capsys.readouterr().out
    assert out.count("max |out - float64 reference| = ") == 8
    errors = [float(line.rsplit("= ", 1)[1]) for line in out.splitlines() if line.startswith("max |out")]
    assert max(errors) < 1e-5, errors  # float32 against float64 at these sizes: ~1e-7
    assert f"decoding one token after {length - 1} cached ones" in out


@pytest.mark.parametrize(("expression", "picture"), [
    ("padding([1, 1, 1, 0])", "# # # .\n" * 4),  # a row of 0/1 flags, 1 = real token
    ("padding([True, False, True])", "# . #\n" * 3),
    ("padding([[1, 1, 0], [1, 0, 0]])", "# # .\n" * 3),  # rows: the first is drawn
    ("padding([3])", "# # #\n" * 3),  # one length
    ("padding(2) & causal()", "# .\n# #\n"),
])
def test_masks_reads_padding_as_typed(expression, picture, capsys):
    assert main(["masks", expression]) == 0
    out = capsys.readouterr().out
    assert out.split("\n", 1)[1].startswith(picture), out
