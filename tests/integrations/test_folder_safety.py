"""Hugging Face folders and converted runs, safely (issue 21 items 1, 5, 9 and 19c): a tokenizer that asks for the
folder's own code is refused by name by every command (no prompt, nothing runs); ``convert --overwrite`` never
touches a Hugging Face model folder (the source itself included); ``convert`` says a tokenizer is missing, and a
converted model never speaks bytes."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
from hf_tiny import tf

from attnkit.cli.main import main


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size - 1)} | {"[UNK]": vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[UNK]")


def _hf_folder(folder: Path, *, vocab_size: int = 64, tokenizer: bool = True) -> Path:
    torch.manual_seed(0)
    config = tf.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=64, vocab_size=vocab_size, max_position_embeddings=64)
    tf.LlamaForCausalLM(config).save_pretrained(folder)
    if tokenizer:
        _tokenizer(vocab_size).save_pretrained(folder)
    return folder


def _ask_for_code(folder: Path, marker: Path) -> None:
    """Make the folder's tokenizer ask for its own code (which would write ``marker``)."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")


@pytest.fixture
def yes_to_every_prompt(monkeypatch):
    """A user who answers "y" to any question (transformers asks before running a folder's code)."""
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "y")
    return asked


@pytest.mark.parametrize("command", [["report", "--no-doctor", "--text", "w1 w2"], ["generate", "--prompt", "w1 w2"],
                                     ["convert"]])
def test_a_tokenizer_asking_for_the_folders_code_is_refused_by_name(tmp_path, capsys, yes_to_every_prompt, command):
    folder, marker = _hf_folder(tmp_path / "hf"), tmp_path / "code-ran.txt"
    _ask_for_code(folder, marker)
    args = ([command[0], "--hf", str(folder), "--out", str(tmp_path / "run")] if command == ["convert"]
            else [command[0], str(folder), *command[1:], *(["--out", str(tmp_path / "r.html")] if command[0] == "report"
                                                            else [])])
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"the tokenizer in '{folder}' asks to run the folder's own Python code (tokenizer_config.json has auto_map " \
           "['AutoTokenizer'])" in err
    assert "trust_remote_code=True" not in err
    assert not marker.exists() and not yes_to_every_prompt
    assert not (tmp_path / "run").exists() and not (tmp_path / "r.html").exists()


def test_a_converted_runs_tokenizer_asking_for_code_is_refused_by_name(tmp_path, capsys, yes_to_every_prompt):
    run, marker = tmp_path / "run", tmp_path / "code-ran.txt"
    assert main(["convert", "--hf", str(_hf_folder(tmp_path / "hf")), "--out", str(run)]) == 0
    _ask_for_code(run / "tokenizer", marker)
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "w1 w2", "--max-new-tokens", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "asks to run the folder's own Python code" in err and "trust_remote_code=True" not in err
    assert not marker.exists() and not yes_to_every_prompt


@pytest.mark.parametrize("same", [True, False], ids=["--hf X --out X", "another HF folder"])
def test_convert_overwrite_never_touches_a_hugging_face_folder(tmp_path, capsys, same):
    source = _hf_folder(tmp_path / "hf")
    out = source if same else _hf_folder(tmp_path / "other")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["convert", "--hf", str(source), "--out", str(out), "--overwrite"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--out '{out}' is not an attnkit run and holds ['config.json']" in err
    assert "--overwrite replaces only an attnkit run's files" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".attnkit.lock"} == before


def test_convert_says_the_tokenizer_is_missing(tmp_path, capsys):
    folder = _hf_folder(tmp_path / "hf", tokenizer=False)
    assert main(["convert", "--hf", str(folder), "--out", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"note: {folder} has no tokenizer files, so the run has none" in out and "need token ids" in out


def test_a_converted_model_with_a_257_token_vocabulary_never_speaks_bytes(tmp_path, capsys):
    folder = _hf_folder(tmp_path / "hf", vocab_size=257, tokenizer=False)  # the byte tokenizer's size, not its tokens
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "hello", "--max-new-tokens", "4"]) == 2
    assert "has no tokenizer to encode --prompt with" in capsys.readouterr().err
    assert main(["generate", str(run), "--ids", "--prompt", "1 2 3", "--max-new-tokens", "4"]) == 0


MALFORMED = {
    "a string size": ("num_attention_heads", "four", "field 'num_attention_heads' is 'four', expected a positive int"),
    "no model_type": ("model_type", None, "field 'model_type' is None, expected the model's type as a string (e.g. 'llama')"),
    "a null size": ("hidden_size", None, "field 'hidden_size' is None, expected a positive int"),
    "a negative size": ("vocab_size", -5, "field 'vocab_size' is -5, expected a positive int"),
    "a string number": ("rope_theta", "x", "field 'rope_theta' is 'x', expected a number"),
    "a list": ("max_position_embeddings", [64], "field 'max_position_embeddings' is [64], expected a positive int"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
@pytest.mark.parametrize("command", ["doctor", "convert", "report"])
def test_a_malformed_config_is_one_typed_line_naming_the_field(tmp_path, capsys, case, command):
    folder = _hf_folder(tmp_path / "hf")
    field, value, words = MALFORMED[case]
    config = json.loads((folder / "config.json").read_text())
    config.pop(field) if value is None and field == "model_type" else config.__setitem__(field, value)
    (folder / "config.json").write_text(json.dumps(config))
    args = {"doctor": ["doctor", str(folder)], "convert": ["convert", "--hf", str(folder), "--out", str(tmp_path / "r")],
            "report": ["report", str(folder), "--no-doctor", "--out", str(tmp_path / "r.html")]}[command]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"'{folder / 'config.json'}': {words}; restore the config.json" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["doctor", "report", "generate"])
def test_a_folder_without_weights_is_refused_saying_the_models_size(tmp_path, capsys, command, monkeypatch):
    folder = _hf_folder(tmp_path / "hf")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    params = sum(p.numel() for p in tf.LlamaForCausalLM(tf.LlamaConfig.from_pretrained(folder)).parameters())
    built = []
    monkeypatch.setattr(tf.LlamaForCausalLM, "post_init", lambda self: built.append(self))  # a real build calls it
    args = {"doctor": ["doctor", str(folder)], "report": ["report", str(folder), "--no-doctor", "--out",
                                                           str(tmp_path / "r.html")],
            "generate": ["generate", str(folder), "--prompt", "w1"]}[command]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"'{folder}' has a config.json but no weights (*.safetensors or *.bin)" in err
    assert f"only an architecture (llama, {params:,} parameters, 0.00 GiB in float32)" in err
    assert all(p.device.type == "meta" for m in built for p in m.parameters())  # nothing built in memory


def test_a_model_larger_than_the_memory_here_is_refused_before_it_is_built(tmp_path, capsys, monkeypatch):
    from attnkit.integrations.hf import folders

    folder = _hf_folder(tmp_path / "hf")
    monkeypatch.setattr(folders, "available_memory", lambda: 1000)
    assert main(["doctor", str(folder)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"'{folder}' holds a model of " in err
    assert "parameters, 0.00 GiB in float32, more than the 0.00 GiB of memory available here" in err
