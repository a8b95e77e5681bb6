"""``attnkit bench hf`` runs end to end at a tiny size and records both sections (no timings asserted)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def test_bench_hf_records_both_sections(tmp_path):
    from attnkit.cli.main import main

    code = main(["bench", "hf", "--seq-len", "64", "--window", "8", "--dim", "32", "--heads", "4", "--kv-heads", "2",
                 "--repeats", "1", "--no-eager", "--sentences", "8", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "hf.json").read_text())
    window = record["sliding_window_training"]
    assert set(window["contenders"]) == {"attnkit", "sdpa"}
    assert {n: r["attnkit_calls_per_step"] for n, r in window["contenders"].items()} == {"attnkit": 2, "sdpa": 0}
    assert window["max_loss_diff_vs_sdpa"] < 1e-5
    assert set(record["attention_alone"]["contenders"]) == {"attnkit", "sdpa_dense_mask"}
    minilm = record["minilm_embeddings"]
    if minilm is not None:  # the package is a test extra
        assert minilm["max_abs_diff_attnkit_vs_package"] < 1e-5
        assert set(minilm["contenders"]) == {"package_sentence_transformers", "hf_attnkit", "hf_sdpa"}


def test_bench_hf_refuses_contenders_that_do_not_run_their_implementation(tmp_path, monkeypatch, capsys):
    """The regression: contenders shared one config, so every model ran the implementation set last."""
    import transformers as tf

    from attnkit.cli.main import main

    monkeypatch.setattr(tf.PreTrainedModel, "set_attn_implementation", lambda self, impl: None)
    code = main(["bench", "hf", "--seq-len", "32", "--window", "8", "--dim", "32", "--heads", "4", "--kv-heads", "2",
                 "--repeats", "1", "--no-eager", "--skip-minilm", "--out", str(tmp_path)])
    assert code == 2 and not (tmp_path / "hf.json").exists()
    assert ("contenders do not run the implementations they are named for: attnkit calls per step "
            "{'attnkit': 0, 'sdpa': 0} (want 2 for 'attnkit', 0 for the others)") in capsys.readouterr().err
