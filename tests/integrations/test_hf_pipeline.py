"""From ``attnkit train`` to transformers (issue 31 item 1): a short run of the ``tiny`` preset (``make demo``'s
model) exports, loads with ``from_pretrained`` and generates in ``pipeline("text-generation")`` with its byte
tokenizer, and the exported model's logits equal attnkit's."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

tf = pytest.importorskip("transformers")

from attnkit.cli.main import main  # noqa: E402
from attnkit.models.builders import lm_config  # noqa: E402
from attnkit.runs import ByteTokenizer, load_model  # noqa: E402
from attnkit.training import TrainConfig, train  # noqa: E402
from oracle import assert_within_rule  # noqa: E402

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "json"


def test_the_tiny_preset_is_llama_s_exact_form():
    from attnkit.integrations.hf.convert import hf_config_for
    from attnkit.models.lm import TransformerLM

    hf_config_for(TransformerLM(lm_config("tiny")), "llama")  # raises, naming the fields, when it is not
    assert lm_config("tiny").resolved_mlp_hidden == 344


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    train(TrainConfig(run_dir=str(root / "run"), preset="tiny", data=str(CORPUS), val_fraction=0.2, seq_len=32,
                      batch_size=4, steps=3, warmup=1, eval_every=3, eval_batches=1, precision="fp32",
                      progress=False), log=lambda *a, **k: None)
    assert main(["export", str(root / "run"), "--hf", str(root / "out")]) == 0
    return root / "run", root / "out"


def test_pipeline_generates_and_its_logits_equal_attnkit_s(exported):
    run, out = exported
    pipe = tf.pipeline("text-generation", model=str(out), device="cpu")
    assert type(pipe.model).__name__ == "LlamaForCausalLM"
    prompt = "def forward(self, x):"
    text = pipe(prompt, max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert text.startswith(prompt) and len(text) > len(prompt)

    ids = pipe.tokenizer(prompt, return_tensors="pt")["input_ids"]  # (1, L)
    assert ids[0].tolist() == ByteTokenizer().encode(prompt)
    ours = load_model(run)
    with torch.no_grad():
        golden = load_model(run).double()(ids)
        assert_within_rule(pipe.model(input_ids=ids).logits, ours(ids), golden, what="pipeline's model logits")
    # greedy: the pipeline's tokens are attnkit's argmax continuation
    generated = pipe(prompt, max_new_tokens=12, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    new = list(generated)[ids.shape[1]:]
    assert new and list(generated)[:ids.shape[1]] == ids[0].tolist()
    tokens = ids
    with torch.no_grad():
        for _ in new:
            tokens = torch.cat([tokens, ours(tokens)[:, -1:].argmax(-1)], dim=1)  # (1, L + 1)
    assert tokens[0, ids.shape[1]:].tolist() == new
