"""The doctor's targets: a run folder the trainer really wrote, and Hugging Face folders whose code never runs."""

import json
import sys
from pathlib import Path

import pytest

from attnkit.cli.main import main
from attnkit.integrations.remote_code import RemoteCodeRefused
from attnkit.runs.source import open_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train_helpers import small_config  # noqa: E402

from attnkit.training import train  # noqa: E402


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = tmp_path_factory.mktemp("doctor") / "demo"
        train(small_config(run, steps=4, ckpt_every=4), log=lambda *a, **k: None)
    finally:
        torch.set_num_threads(threads)
    return run


def test_doctor_on_a_run_folder_the_trainer_wrote(trained_run, capsys):
    """issue 11 defect 4: the trainer's config.json made the loader take the run for a Hugging Face folder."""
    assert (trained_run / "config.json").is_file() and (trained_run / "checkpoints").is_dir()
    source = open_source(str(trained_run))
    model, fresh = source.model, source.fresh
    assert fresh is False and type(model).__name__ == "TransformerLM"
    assert main(["doctor", str(trained_run), "--checks", "causal-leak", "kv-cache"]) == 0
    out = capsys.readouterr().out
    assert "PASS  causal-leak" in out and "PASS  kv-cache" in out
    assert open_source(str(trained_run / "config.json")).fresh is False  # the config file itself names the run too


def test_open_source_says_what_each_target_is(trained_run, tmp_path):
    """issue 20: one place turns a target into a model, its tokenizer, its metrics, its kind and whether its weights
    were loaded (the doctor skips its initialisation checks on loaded weights)."""
    from attnkit.runs import ByteTokenizer, locate
    from attnkit.runs.read import list_checkpoints

    newest = list_checkpoints(trained_run)[-1]
    expected = {"nano": ("preset", False, True, None), str(trained_run): ("run", True, False, trained_run),
                str(newest): ("checkpoint", True, False, trained_run)}
    for target, (kind, loaded, fresh, run) in expected.items():
        source = open_source(target)
        assert (source.kind, source.loaded, source.fresh) == (kind, loaded, fresh), target
        assert source.metrics == (None if run is None else run / "metrics.jsonl")
        assert isinstance(source.tokenizer, ByteTokenizer) and not source.model.training
    transformers = pytest.importorskip("transformers")
    source = open_source("hf-llama-tiny")
    assert (source.kind, source.loaded, source.fresh, source.tokenizer) == ("hf-tiny", False, True, None)
    assert type(open_source("hf-llama-tiny", convert=True).model).__name__ == "TransformerLM"
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    assert locate(str(tmp_path / "hf")).kind == "hf-folder"
    source = open_source(str(tmp_path / "hf"))  # weights of unknown training
    assert (source.loaded, source.fresh, source.metrics) == (True, None, None)


def test_run_folder_before_its_first_checkpoint_says_so(tmp_path, trained_run):
    run = tmp_path / "starting"
    run.mkdir()
    (run / "config.json").write_text((trained_run / "config.json").read_text())
    assert main(["doctor", str(run)]) == 2  # a typed CheckpointError, not a transformers traceback


def _remote_code_folder(root: Path) -> tuple[Path, Path]:
    transformers = pytest.importorskip("transformers")
    folder, marker = root / "evil", root / "code-ran.txt"
    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import GPT2Config as EvilConfig, GPT2LMHeadModel as EvilModel\n")
    return folder, marker


def test_auto_map_model_is_refused_and_its_code_never_runs(tmp_path, capsys, monkeypatch):
    """issue 16 item 19: a folder with custom code is refused (even answering "y" to any prompt)."""
    folder, marker = _remote_code_folder(tmp_path)
    monkeypatch.setattr("builtins.input", lambda *a, **k: "y")
    with pytest.raises(RemoteCodeRefused, match=r"custom code \(config.json has auto_map \['AutoConfig', "
                                                r"'AutoModelForCausalLM'\]\); attnkit never runs"):
        open_source(str(folder))
    assert main(["doctor", str(folder)]) == 2
    assert "never runs a model folder's Python code" in capsys.readouterr().err
    assert not marker.exists()


def test_convert_and_report_refuse_auto_map_too(tmp_path, capsys, monkeypatch):
    """Every command that opens a Hugging Face folder goes through the same refusal (issue 16 item 19)."""
    folder, marker = _remote_code_folder(tmp_path)
    monkeypatch.setattr("builtins.input", lambda *a, **k: "y")
    assert main(["convert", "--hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert main(["report", str(folder), "--text", "hi", "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("never runs a model folder's Python code") == 2, err
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_hugging_face_folders_load_with_trust_remote_code_false(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    seen = []
    for cls in (transformers.AutoConfig, transformers.PreTrainedModel):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            seen.append((klass.__name__, kwargs.get("trust_remote_code")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    source = open_source(str(folder))
    model, fresh = source.model, source.fresh
    # loaded weights (fresh None: of unknown training); the class is the folder's own architecture
    assert source.loaded and fresh is None and type(model).__name__ == "GPT2LMHeadModel"
    assert ("GPT2LMHeadModel", False) in seen and all(flag is False for _, flag in seen), seen


def test_a_config_that_is_not_json_is_a_typed_error(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="config.json' is not a JSON object; a Hugging Face folder needs"):
        open_source(str(tmp_path))
