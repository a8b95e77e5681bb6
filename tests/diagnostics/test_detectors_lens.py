"""issue 29 item 3: attnkit's head detectors give TransformerLens' own scores: its forward pass and
``transformer_lens.head_detector.detect_head`` on the same GPT-2-shaped weights, within 1e-6.

Skipped without transformer_lens (the ``lens`` test extra: ``pip install 'attnkit[lens]'``); it pulls wandb, datasets
and accelerate, so the project's own venv does without it and this file was run in a side venv that adds it to the
same torch and transformers (the commit's message and docs/report.md say which versions)."""

import pytest
import torch

transformer_lens = pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")

from attnkit.diagnostics.detectors import detect_heads  # noqa: E402

IDS = torch.tensor([[5, 9, 12, 30, 41, 63, 5, 9, 12, 30, 41, 63, 7, 5]])  # a run of tokens, twice: induction probe
NAMES = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
         "induction": "induction_head"}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A 2-layer GPT-2 with sharpened queries and keys (random weights attend almost uniformly, where every
    detector scores alike), saved as a folder TransformerLens boots offline."""
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    config = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, :64] *= 6  # q and k columns of the fused projection
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("exclude", [{}, {"exclude_bos": True}, {"exclude_current_token": True}])
def test_detectors_match_transformer_lens(gpt2, exclude):
    from transformer_lens.head_detector import detect_head
    from transformer_lens.model_bridge import TransformerBridge

    lens_model = transformers.GPT2LMHeadModel.from_pretrained(gpt2).eval()
    bridge = TransformerBridge.boot_transformers(str(gpt2), hf_model=lens_model, device="cpu")
    bridge.to_tokens = lambda seq, *a, **k: IDS  # the tiny model has no tokenizer: detect_head reads these ids
    ours = detect_heads(transformers.GPT2LMHeadModel.from_pretrained(gpt2).eval(), IDS, **exclude)
    for name, lens_name in NAMES.items():
        theirs = detect_head(bridge, "ids", lens_name, **exclude).double()  # (layers, heads)
        assert theirs.shape == ours[name].shape
        err = float((ours[name] - theirs).abs().max())
        assert err <= 1e-6, (name, exclude, err, ours[name], theirs)
        print(f"{name} {exclude}: max |attnkit - TransformerLens| = {err:.2e}")
    spread = float(ours["previous_token"].max() - ours["previous_token"].min())
    assert spread > 0.05, spread  # the heads differ: agreement is not a uniform pattern's
