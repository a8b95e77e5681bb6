"""The doctor is never wrong on a correct model (issue 29 item 1, issue 33 item 10), and still catches broken ones.

Correct subjects: transformers' own implementations of the families whose intended design or refused dtype the
doctor used to read as a bug (tiny random configs, ``attnkit.integrations.hf.zoo``); the other families of the zoo
run in ``attnkit bench doctor-zoo`` (benchmarks/results/doctor_zoo.json). Broken subjects: the same models with a
bug planted, each still FAILed by name through the new fallbacks (float32 probes, departures, refusals).
"""

import json

import pytest
import torch
from diag_zoo import good_attention, hf_with_attention

import attnkit as ak
from attnkit.cli.main import main
from attnkit.diagnostics import departures as dep

tf = pytest.importorskip("transformers")
from attnkit.integrations.hf import zoo  # noqa: E402

tf.logging.set_verbosity_error()

#: the checks the old false FAILs were in
AT_STAKE = ["departures", "causal-leak", "padding-leak", "kv-cache", "scale", "backend-agreement"]
F32 = "compared in float32: float64 refused: RuntimeError: Expected mat_a to be Float32"

#: family -> {check: (status, words in its evidence)}: what each fixed family must now say
EXPECTED = {
    "mixtral": {"causal-leak": ("PASS", F32), "padding-leak": ("PASS", F32), "kv-cache": ("PASS", F32),
                "backend-agreement": ("PASS", "vs eager (" + F32)},
    "qwen3_moe": {"causal-leak": ("PASS", F32), "kv-cache": ("PASS", F32)},
    "deepseek_v3": {"causal-leak": ("PASS", F32), "departures": ("INFO", "config.v_head_dim=6: multi-head latent"),
                    "scale": ("INFO", "0.3743 set by config.rope_parameters=")},
    "gpt_oss": {"causal-leak": ("PASS", F32), "departures": ("INFO", "config.sinks=")},
    "gemma2": {"scale": ("INFO", "0.3536 set by config.query_pre_attn_scalar=8, not 1/sqrt(d_k=16) = 0.25: intended"),
               "backend-agreement": ("PASS", "sdpa can't serve it (ValueError: Gemma2ForCausalLM does not support"),
               "departures": ("INFO", "config.attn_logit_softcapping=50.0: scores softcapped")},
    "gemma3": {"scale": ("INFO", "set by config.query_pre_attn_scalar=16"),
               "departures": ("INFO", "layers 0, 1: a sliding window of 4 keys; layer 2: full")},
    "granite": {"scale": ("INFO", "0.125 set by config.attention_multiplier=0.125, not 1/sqrt(d_k=8)")},
    "roberta": {"padding-leak": ("PASS", "left padding x3"), "causal-leak": ("SKIP", "bidirectional encoder")},
}


def test_the_zoo_is_29_families_of_transformers_config_classes():
    assert len(zoo.names()) == 29 and len(set(zoo.names())) == 29
    assert all(isinstance(getattr(tf, f.config), type) for f in zoo.FAMILIES.values())
    a, b = zoo.build("gpt2", seed=3), zoo.build("gpt2", seed=3)
    assert not a.training and all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert next(a.parameters()).dtype == torch.float32 and type(zoo.build("bert")).__name__ == "BertForMaskedLM"
    with pytest.raises(ak.errors.AttnkitValueError, match="family='nope' is not in the zoo; choose from"):
        zoo.build("nope")


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_no_false_fail_on_a_correct_family(family):
    report = ak.doctor.examine(zoo.build(family), checks=AT_STAKE)
    assert report.counts()["FAIL"] == 0, str(report)
    assert all(r.evidence for r in report.results)
    for name, (status, words) in EXPECTED[family].items():
        assert report[name].status == status and words in report[name].evidence, str(report)


def test_llama4_temperature_spares_left_padding_and_right_padding_still_catches_a_leak():
    result = ak.doctor.examine(zoo.build("llama4"), checks=["padding-leak"])["padding-leak"]
    assert result.status == "INFO" and "right padding x3" in result.evidence and "left padding x" not in result.evidence
    assert "left padding not compared: left padding shifts the index i by design (config.attn_temperature_tuning" \
        in result.evidence

    def no_mask(q, k, v, allowed):  # sees every key: the right pads too
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    broken = hf_with_attention(zoo.build("llama4"), "doctor_zoo_no_mask", no_mask)
    result = ak.doctor.examine(broken, checks=["padding-leak"])["padding-leak"]
    assert result.status == "FAIL" and "padding leaks into real outputs: right padding" in result.evidence


def test_a_leaking_mixture_of_experts_still_fails_causal_leak_in_float32():
    def no_causal_mask(q, k, v, allowed):
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    leaky = hf_with_attention(zoo.build("mixtral"), "doctor_zoo_leaky_moe", no_causal_mask)
    result = ak.doctor.examine(leaky, checks=["causal-leak"])["causal-leak"]
    assert result.status == "FAIL" and "future tokens leak into earlier hidden states" in result.evidence
    assert F32 in result.evidence


class Float32Only(torch.nn.Module):
    """Attention over x (B, L, E) whose kernel takes float32 only; ``leak`` drops the mask."""

    def __init__(self, leak: bool = False, E: int = 16):
        super().__init__()
        self.embed_dim, self.leak = E, leak
        self.qkv = torch.nn.Linear(E, 3 * E)

    def forward(self, x, mask=None):
        if x.dtype != torch.float32:
            raise RuntimeError(f"this kernel takes float32 only, got {x.dtype}")
        q, k, v = self.qkv(x)[:, None].chunk(3, -1)  # (B, 1, L, E) each: one head
        return good_attention(q, k, v, None if self.leak else mask)[:, 0]  # (B, L, E)


def test_a_module_that_refuses_float64_is_compared_in_float32_and_a_leak_still_fails():
    good = ak.doctor.examine(Float32Only(), checks=["causal-leak", "padding-leak", "layout"])
    assert good.ok and {r.status for r in good.results} == {"PASS"}, str(good)
    assert "compared in float32: float64 refused: RuntimeError: this kernel takes float32 only" \
        in good["causal-leak"].evidence
    bad = ak.doctor.examine(Float32Only(leak=True), checks=["causal-leak"])["causal-leak"]
    assert bad.status == "FAIL" and "future inputs leak into earlier outputs" in bad.evidence, bad.evidence


def test_a_scale_the_config_does_not_set_still_fails():
    gemma = zoo.build("gemma2")
    for layer in gemma.model.layers:
        layer.self_attn.scaling = 1.0
    result = ak.doctor.examine(gemma, checks=["scale"])["scale"]
    assert result.status == "FAIL" and "missing scale" in result.evidence
    assert "is not the 0.3536 that config.query_pre_attn_scalar=8 sets" in result.evidence
    granite = zoo.build("granite")
    for layer in granite.model.layers:
        layer.self_attn.scaling = 8 ** -0.5  # 1/sqrt(d_k), but the config says attention_multiplier=0.125
    result = ak.doctor.examine(granite, checks=["scale"])["scale"]
    assert result.status == "FAIL" and "the config's field is ignored" in result.evidence, result.evidence


def test_gpt2_scale_switches_are_departures_layer_by_layer():
    config = zoo.config("gpt2")
    config.scale_attn_by_inverse_layer_idx = True  # layer i divides its scores by i + 1 too
    result = ak.doctor.examine(tf.GPT2LMHeadModel(config).eval(), checks=["scale"])["scale"]
    assert result.status == "INFO", result.evidence
    assert result.evidence == ("1 of 2 attention calls use 0.1768 set by config.scale_attn_by_inverse_layer_idx=True, "
                               "not 1/sqrt(d_k=8) = 0.3536: intended")
    config = zoo.config("gpt2")
    config.scale_attn_weights = False
    result = ak.doctor.examine(tf.GPT2LMHeadModel(config).eval(), checks=["scale"])["scale"]
    assert result.status == "INFO" and "2 of 2 attention calls use 1 set by config.scale_attn_weights=False" \
        in result.evidence, result.evidence


def test_a_field_at_the_plain_value_is_no_departure():
    config = zoo.config("gemma2")
    config.query_pre_attn_scalar = config.head_dim  # Gemma 2 9B: 256 with head_dim 256, plain 1/sqrt(d)
    model = tf.Gemma2ForCausalLM(config).eval()
    assert "query_pre_attn_scalar" not in [d.field for d in dep.departures(model)]
    assert "attn_logit_softcapping" in [d.field for d in dep.departures(model)]
    result = ak.doctor.examine(model, checks=["scale"])["scale"]
    assert result.status == "PASS" and "use 1/sqrt(d_k)" in result.evidence, result.evidence


def test_a_probe_the_subject_cannot_take_skips_with_the_reason():
    def square_masks_only(q, k, v, mask):
        if mask is not None and mask.dim() != 2:
            raise NotImplementedError(f"mask of {mask.dim()} dims: this kernel takes (Lq, Lk) masks only")
        return good_attention(q, k, v, mask)

    report = ak.doctor.examine(square_masks_only, checks=["padding-leak", "causal-leak"])
    assert report["padding-leak"].status == "SKIP" and report.ok, str(report)
    assert report["padding-leak"].evidence.startswith(
        "could not run: its probe raised NotImplementedError: mask of 4 dims: this kernel takes (Lq, Lk) masks only")
    assert report["causal-leak"].status == "PASS"


def test_a_departure_is_one_registered_reader(monkeypatch):
    monkeypatch.setitem(dep.READERS, "my_scale", lambda config, model: dep.Departure(
        "my_scale", 0.5, "scores scaled by my_scale", scale=0.5) if getattr(config, "my_scale", None) else None)
    model = zoo.build("llama")
    model.config.my_scale = 0.5
    for layer in model.model.layers:
        layer.self_attn.scaling = 0.5
    report = ak.doctor.examine(model, checks=["departures", "scale"])
    assert report["departures"].status == "INFO" and "config.my_scale=0.5: scores scaled by my_scale" \
        in report["departures"].evidence
    assert report["scale"].status == "INFO" and "0.5 set by config.my_scale=0.5" in report["scale"].evidence
    plain = ak.doctor.examine(zoo.build("llama"), checks=["departures"])["departures"]
    assert plain.status == "PASS" and "declares none of the" in plain.evidence
    with pytest.raises(ak.errors.AttnkitValueError, match="departure name must be a non-empty string"):
        dep.departure("")


def test_the_doctor_on_a_healthy_gemma2_folder_exits_0(tmp_path, capsys):
    """Issue 33 item 10: the scale check ran SDPA (which Gemma 2 refuses) and backend-agreement switched to it."""
    zoo.build("gemma2").save_pretrained(tmp_path / "gemma2")
    assert main(["doctor", str(tmp_path / "gemma2"), "--json", "-q", "--checks", "scale", "backend-agreement"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["scale"]["status"] == "INFO" and "config.query_pre_attn_scalar" in checks["scale"]["evidence"]
    assert checks["backend-agreement"]["status"] == "PASS" and "sdpa can't serve it" in \
        checks["backend-agreement"]["evidence"]
