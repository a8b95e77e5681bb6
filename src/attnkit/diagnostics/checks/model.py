"""Model-level checks: initialisation, attention health on a sample input, and the overfit-10-samples habit.

Shape legend: B batch, H heads, L length, V vocab size.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.checks.base import (
    FAIL,
    PASS,
    WARN,
    Outcome,
    Skip,
    causal_mask,
    check,
    gen,
    model_device,
    run_main,
    sample_inputs,
    tokens_for,
)
from attnkit.diagnostics.metrics import HealthThresholds, head_metrics, record_metrics

RESIDUAL_NAMES = {"out_proj", "c_proj", "o_proj", "down", "down_proj", "fc2", "wo"}


def _fan_in(module: nn.Module) -> int | None:
    if isinstance(module, nn.Linear):
        return module.weight.shape[1]
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:  # HF GPT-2: (in, out)
        return module.weight.shape[0]
    return None


def _n_layers(module: nn.Module) -> int:
    config = getattr(module, "config", None)
    for attr in ("num_layers", "num_hidden_layers", "n_layer"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1


def first_loss(subject, options) -> tuple[float, float] | None:
    """(loss of the untrained model on random tokens, log(vocab)); None without logits."""
    lm = subject.lm
    if lm is None or not lm.outputs_logits:
        return None
    s = subject.cast(torch.float32)
    tokens = tokens_for(lm.vocab_size, 4, 16, gen(options, 14), model_device(s))
    with torch.no_grad():
        logits = s.lm.forward(tokens).float()  # (B, L, V)
    if lm.causal:
        logits, targets = logits[:, :-1], tokens[:, 1:]
    else:
        targets = tokens
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return float(loss), math.log(lm.vocab_size)


@check("init", "initialisation",
       "Draw weights from normal(0, 0.02) (or ~1/sqrt(fan_in)), scale the residual output projections by "
       "1/sqrt(2 * num_layers), and check the first loss is about log(vocab).", order=100)
def init(subject, options) -> Outcome:
    if options.fresh is False:
        raise Skip(f"{options.not_fresh_because}: initialisation does not apply to loaded weights")
    if subject.module is None:
        raise Skip("needs a module with weights")
    n_layers = _n_layers(subject.module)
    too_big, too_small, stds, resid, other = [], [], {}, [], []
    for name, m in subject.module.named_modules():
        fan_in = _fan_in(m)
        if fan_in is None:
            continue
        std = float(m.weight.detach().float().std())
        stds[name] = std
        (resid if name.rsplit(".", 1)[-1] in RESIDUAL_NAMES else other).append(std)
        hi = 3 * max(0.02, 1 / math.sqrt(fan_in))
        lo = min(0.02 / math.sqrt(2 * n_layers), 1 / math.sqrt(3 * fan_in)) / 4
        if std > hi:
            too_big.append(f"{name or type(m).__name__} std {std:.3g} > {hi:.3g} = 3 x max(0.02, 1/sqrt(fan_in={fan_in}))")
        elif 0 < std < lo:
            too_small.append(f"{name or type(m).__name__} std {std:.3g} < {lo:.3g}")
    if not stds:
        raise Skip("no linear layers to inspect")
    details: dict = {"weight_std": stds}
    scaled = bool(resid) and bool(other) and sum(resid) / len(resid) < 0.8 * sum(other) / len(other)
    parts = [f"{len(stds)} linear layers, std {min(stds.values()):.3g}..{max(stds.values()):.3g}",
             f"residual projections scaled: {'yes' if scaled else 'no'}"]
    status = PASS
    loss = first_loss(subject, options)
    if loss is not None:
        details["first_loss"], details["log_vocab"] = loss
        parts.append(f"first loss {loss[0]:.3f} vs log(V) {loss[1]:.3f}")
        if loss[0] > loss[1] + 1.0:
            status = FAIL if options.fresh else WARN
            parts.insert(0, f"first loss {loss[0]:.2f} is far above log(vocab) {loss[1]:.2f}: logits too large at init")
    if too_big:
        status = FAIL
        parts.insert(0, "too large (attention collapses at init): " + "; ".join(too_big[:2]))
    elif too_small and status == PASS:
        status = WARN
        parts.insert(0, "very small weights: " + "; ".join(too_small[:2]))
    return Outcome(status, "; ".join(parts), details)


def _on_text(subject, options) -> list[tuple[str, object]]:
    """(layer, metrics) of the user's text, gathered exactly as the report's table is (its collect())."""
    from attnkit.diagnostics.report.collect import collect

    tokens = options.text.reshape(1, -1).to(model_device(subject))  # (1, L)
    data = collect(subject.module, tokens, [str(t) for t in tokens[0].tolist()], thresholds=options.thresholds)
    return [(layer.name, head_metrics(layer.weights[None], None if layer.allowed is None else layer.allowed[None]))
            for layer in data.layers]


def _hf_attentions(s, options):
    """(layer name, weights (B, H, L, L), allowed) from a Hugging Face model run with eager attention."""
    model = s.module
    original = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=sample_inputs(s, options), output_attentions=True)
    finally:
        model.set_attn_implementation(original)
    allowed = causal_mask(options.seq_len) if s.lm.causal else None
    return [(f"layer {i}", w, allowed) for i, w in enumerate(out.attentions)]


@check("attention-health", "attention health",
       "Collapsed heads: lower the learning rate, add warmup, QK-norm or a logit softcap, and check the scale; "
       "uniform heads after training: the attention learned nothing - check the masks and the scale.", order=110)
def attention_health(subject, options) -> Outcome:
    if subject.module is None:
        raise Skip("needs a model to run on a sample input (a bare function has no weights to watch)")
    s = subject.cast(torch.float32)
    per_layer = []
    on = f"random inputs ({options.batch} x {options.seq_len})"
    if options.text is not None and subject.kind in ("attnkit-model", "huggingface"):
        per_layer, on = _on_text(subject, options), options.text_note or f"the given text ({options.text.numel()} tokens)"
    elif subject.kind == "huggingface":
        for layer, w, allowed in _hf_attentions(s, options):
            per_layer.append((layer, head_metrics(w, allowed)))
    else:
        with torch.no_grad(), capture(s.module) as cap:
            run_main(s, sample_inputs(s, options))
        for layer, records in cap.by_layer().items():
            per_layer.append((layer or "<module>", record_metrics(records[-1])))
    if not per_layer:
        raise Skip("no attention call was observed (the module does not run attnkit.attention)")
    t = options.thresholds or HealthThresholds()
    collapsed, uniform, leaks = [], [], []
    n_heads = 0
    details = {}
    for layer, m in per_layer:
        verdicts = m.verdicts(t)
        n_heads += len(verdicts)
        details[layer] = {"metrics": m.to_dict(), "verdicts": verdicts}
        if max(m.masked_mass) > t.masked_mass_tol or any(math.isnan(v) for v in m.max_prob):
            leaks.append(layer)
        if hs := [h for h, v in enumerate(verdicts) if v == "collapsed"]:
            collapsed.append(f"{layer} heads {hs}")
        if hs := [h for h, v in enumerate(verdicts) if v == "uniform"]:
            uniform.append(f"{layer} heads {hs}")
    details["measured_on"] = on
    on = f" (measured on {on})"
    if leaks:
        return Outcome(FAIL, f"probability on masked keys or NaN weights in {leaks}{on}", details)
    parts = []
    if collapsed:
        parts.append(f"collapsed (max prob >= {t.collapsed_max_prob}): " + "; ".join(collapsed))
    if uniform:
        parts.append(f"uniform (entropy >= {t.uniform_norm_entropy} log n): " + "; ".join(uniform))
    if collapsed:
        return Outcome(WARN, "; ".join(parts) + on, details)
    if uniform and not options.fresh:
        return Outcome(WARN, "; ".join(parts) + " (expected only at initialisation)" + on, details)
    if uniform:
        return Outcome(PASS, f"{len(per_layer)} layers, {n_heads} heads: near uniform, as expected at initialisation"
                       + on, details)
    return Outcome(PASS, f"{len(per_layer)} layers, {n_heads} heads, none collapsed or uniform" + on, details)


@check("overfit", "overfit 10 samples",
       "The model can't memorise 10 samples: look for a bug in the data, the target shift (predict token t+1 from "
       "tokens <= t), the mask or the optimiser before scaling up.", order=120)
def overfit(subject, options) -> Outcome:
    if not options.overfit:
        raise Skip("optional: pass overfit=True to train a copy on 10 samples")
    lm = subject.lm
    if lm is None or not lm.outputs_logits or subject.rebuild is None:
        raise Skip("needs a token model with logits")
    model = copy.deepcopy(subject.module).float().train()
    s = subject.rebuild(model)
    g = gen(options, 15)
    tokens = tokens_for(lm.vocab_size, 10, 12, g, model_device(s))
    tokens[:, 0] = torch.arange(10) % (lm.vocab_size - 1) + 1  # distinct first tokens: every target is determined
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(options.overfit_steps):
        logits = s.lm.forward(tokens).float()
        pred, target = (logits[:, :-1], tokens[:, 1:]) if lm.causal else (logits, tokens)
        loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if losses[-1] < 0.05 * losses[0]:
            break
    details = {"losses": losses[:: max(1, len(losses) // 20)], "steps": len(losses)}
    text = f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps on 10 samples"
    if losses[-1] <= 0.1 * losses[0]:
        return Outcome(PASS, text, details)
    return Outcome(FAIL, text + " (did not fall below 10% of the start)", details)
