"""The doctor checks that come from the labs: each passes a correct subject and flags a broken one by name."""

import torch
from torch import nn

import attnkit as ak
from attnkit.diagnostics.checks import REGISTRY, names
from attnkit.diagnostics.checks.attention_dropout import LAB_EVIDENCE
from attnkit.diagnostics.checks.extrapolation import BAND
from attnkit.models.builders import build_lm

NEW = ["extrapolation", "attention-dropout", "init-scale"]


def nano(**kw):
    torch.manual_seed(0)
    return build_lm("nano", vocab_size=61, max_seq_len=16, **kw)


class ForgetsPastTraining(nn.Module):
    """A decoder whose logits are garbage at positions past its training length (16)."""

    def __init__(self):
        super().__init__()
        self.inner = nano(positions="alibi")
        self.config = self.inner.config

    def new_cache(self, batch_size, **kw):
        return self.inner.new_cache(batch_size, **kw)

    def forward(self, tokens, *, positions=None, cache=None, key_is_real=None):
        logits = self.inner(tokens, positions=positions, cache=cache, key_is_real=key_is_real)  # (B, L, V)
        pos = torch.arange(tokens.shape[1])[None] if positions is None else positions  # (1|B, L)
        spike = torch.zeros(logits.shape[-1])
        spike[0] = 30.0
        return torch.where((pos >= self.config.max_seq_len)[..., None], logits + spike, logits)


def run(model, name, **kw):
    return ak.doctor.examine(model, checks=[name], **kw)[name]


def test_new_checks_are_registered_and_run():
    assert set(NEW) <= set(REGISTRY) and set(NEW) <= set(names())
    report = ak.doctor.examine(nano(), fresh=True)
    assert set(NEW) <= {r.name for r in report.results}


def test_extrapolation_passes_a_model_that_reads_any_length():
    result = run(nano(positions="alibi"), "extrapolation", fresh=True)
    assert result.status == "PASS", result.evidence
    assert set(result.details["losses"]) == {1, 2, 4} and result.details["ratio_4x"] <= BAND


def test_extrapolation_warns_when_the_loss_climbs_past_the_training_length():
    result = run(ForgetsPastTraining(), "extrapolation")
    assert result.status == "WARN", result.evidence
    assert "loss climbs past the training length" in result.evidence
    assert result.details["ratio_4x"] > BAND


def test_extrapolation_warns_when_learned_positions_refuse_longer_inputs():
    result = run(nano(positions="learned"), "extrapolation", fresh=True)
    assert result.status == "WARN" and "refuses inputs of 2x its training length 16" in result.evidence
    assert "max_positions=16" in result.evidence


def test_extrapolation_skips_without_a_training_length():
    def attn(q, k, v, mask):
        return ak.attention(q, k, v, mask)

    assert run(attn, "extrapolation").status == "SKIP"


def test_attention_dropout_passes_with_dropout_and_is_info_without():
    good = run(nano(dropout=0.1), "attention-dropout", fresh=True)
    assert good.status == "PASS" and "attention dropout 0.1..0.1 in 2 settings" in good.evidence
    # the pitfalls lab rates "dropout narrows the gap" as not holding at this scale: a fact, not a warning
    zero = run(nano(), "attention-dropout", fresh=True)
    assert zero.status == "INFO" and "attention dropout is 0 in 2 of 2 settings" in zero.evidence
    assert LAB_EVIDENCE in zero.evidence and "does not hold at this scale" in zero.evidence


def test_attention_dropout_skips_models_not_meant_for_training():
    assert run(nano(), "attention-dropout", fresh=False).status == "SKIP"
    assert run(nano().eval(), "attention-dropout").status == "SKIP"


def test_init_scale_passes_gpt_init_and_fails_normal_one():
    good = run(nano(), "init-scale", fresh=True)
    assert good.status == "PASS", good.evidence
    assert abs(good.details["first_loss"] - good.details["log_vocab"]) < 0.5
    bad = run(nano(init_std=1.0), "init-scale", fresh=True)
    assert bad.status == "FAIL" and "outputs far too large at init" in bad.evidence, bad.evidence
    assert bad.details["logit_std"] > 5


def test_init_scale_skips_trained_models():
    assert run(nano(), "init-scale", fresh=False).status == "SKIP"
