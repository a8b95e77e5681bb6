"""``attnkit bench hf`` runs end to end at a tiny size and records both sections (no timings asserted)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")


def test_bench_hf_records_both_sections(tmp_path):
    from attnkit.cli.main import main

    code = main(["bench", "hf", "--seq-len", "64", "--window", "8", "--dim", "32", "--heads", "4", "--kv-heads", "2",
                 "--repeats", "1", "--no-eager", "--sentences", "8", "--parts", "training,minilm", "--out", str(tmp_path)])
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
                 "--repeats", "1", "--no-eager", "--skip-minilm", "--parts", "training", "--out", str(tmp_path)])
    assert code == 2 and not (tmp_path / "hf.json").exists()
    assert ("contenders do not run the implementations they are named for: attnkit calls per step "
            "{'attnkit': 0, 'sdpa': 0} (want 2 for 'attnkit', 0 for the others)") in capsys.readouterr().err


GENERATE = ["bench", "hf", "--parts", "generate", "--gen-layers", "2", "--gen-dim", "32", "--heads", "4", "--kv-heads",
            "2", "--gen-prompt", "5", "--gen-new-tokens", "6", "--gen-short-tokens", "4", "--gen-window", "4",
            "--repeats", "1", "--no-compile"]


def test_bench_hf_generate_records_every_family_and_cache(tmp_path):
    from attnkit.cli.main import main

    assert main([*GENERATE, "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "hf.json").exists()
    families = json.loads((tmp_path / "hf_generate.json").read_text())["generate"]["families"]
    assert list(families) == ["llama", "mistral", "qwen2", "gpt2", "gemma2"]
    llama = families["llama"]
    assert set(llama["contenders"]) == {f"{impl}_{kind}" for impl in ("attnkit", "sdpa", "eager")
                                        for kind in ("dynamic", "static")}
    assert llama["same_tokens"] and llama["attnkit_calls_per_generate"] == 2 * 6  # 2 layers x (prefill + 5 steps)
    assert set(families["gpt2"]["contenders"]) == {"attnkit_dynamic", "sdpa_dynamic", "attnkit_static", "sdpa_static"}
    assert families["gemma2"]["baseline"] == "eager"  # sdpa refuses Gemma-2's softcap
    assert set(families["gemma2"]["contenders"]) == {"attnkit_dynamic", "eager_dynamic", "attnkit_static",
                                                     "eager_static"}
    for block in families.values():
        assert block["attnkit_calls_per_generate"] > 0 and block["new_tokens"] in (6, 4)
        assert all(r["tokens_per_s"] > 0 and r["vs_baseline"] > 0 for r in block["contenders"].values())


def test_bench_hf_generate_refuses_contenders_that_do_not_run_their_implementation(tmp_path, monkeypatch, capsys):
    import transformers as tf

    from attnkit.cli.main import main

    monkeypatch.setattr(tf.PreTrainedModel, "set_attn_implementation", lambda self, impl: None)
    assert main([*GENERATE, "--families", "llama", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "hf_generate.json").exists()
    assert "llama: contenders do not run the implementations they are named for: attnkit calls per generate " \
           "{'attnkit': 0, 'sdpa': 0, 'eager': 0}" in capsys.readouterr().err


def test_bench_hf_generate_refuses_contenders_whose_tokens_differ(tmp_path, monkeypatch, capsys):
    """A speed ratio between different outputs means nothing: the bench stops instead of recording it."""
    import attnkit.integrations.hf.attention as glue
    from attnkit.cli.main import main

    real = glue.attention

    def off_by_a_lot(q, k, v, *args, **kwargs):
        out = real(q, k, v, *args, **kwargs)
        return out + 10.0 * torch.randn_like(out)

    monkeypatch.setattr(glue, "attention", off_by_a_lot)
    assert main([*GENERATE, "--families", "gpt2", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "hf_generate.json").exists()
    assert "gpt2: greedy tokens of ['attnkit_dynamic', 'attnkit_static'] differ from sdpa's on the same cache" in \
        capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--families", "--compile-families"])
def test_bench_hf_generate_refuses_unknown_families(tmp_path, capsys, flag):
    from attnkit.cli.main import main

    args = [a for a in GENERATE if a != "--no-compile"]
    assert main([*args, flag, "llama,falcon", "--out", str(tmp_path)]) == 2
    assert f"{flag} 'llama,falcon': choose from llama, mistral, qwen2, gpt2, gemma2 (comma-separated), got " \
           "unknown ['falcon']" in capsys.readouterr().err


def test_bench_hf_refuses_unknown_parts(tmp_path, capsys):
    from attnkit.cli.main import main

    assert main(["bench", "hf", "--parts", "training,speed", "--out", str(tmp_path)]) == 2
    assert "--parts 'training,speed': choose from training, minilm, generate" in capsys.readouterr().err


def test_bench_hf_sliding_records_every_family_with_logits_equal_eager(tmp_path):
    from attnkit.cli.main import main

    code = main(["bench", "hf", "--parts", "sliding", "--sliding-lengths", "64", "--sliding-layers", "2",
                 "--repeats", "1", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "hf_sliding.json").read_text())
    assert set(record["families"]) == {"mistral", "gemma3", "gpt_oss", "llama4_chunked"}
    for family, block in record["families"].items():
        row = block["lengths"]["64"]
        assert row["max_logit_diff_vs_eager"] <= 1e-5, (family, row["max_logit_diff_vs_eager"])
        want = {"attnkit", "eager"} | ({"sdpa"} if family != "gpt_oss" else set())
        assert set(row["forward"]) == set(row["forward_backward"]) == want, family
    assert record["families"]["gemma3"]["layers"] == 6  # 5 local : 1 global
