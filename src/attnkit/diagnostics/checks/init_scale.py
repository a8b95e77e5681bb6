"""Init scale: what a fresh model outputs, not what its weights look like (``init`` reads the weights).

On random tokens at initialisation: the first loss against ln(vocab) (a model that knows nothing should
be uniform: loss = ln V), the standard deviation of the output logits, and the largest attention logit
(pre-softmax score) of attnkit layers. ``attnkit lab pitfalls`` shows what a normal(0, 1) init does to
training: a first loss of several times ln V and a worse loss after the same steps.

Shape legend: B batch, L length, V vocab size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.checks.base import FAIL, PASS, WARN, Outcome, Skip, check, gen, model_device, tokens_for

FIRST_LOSS_WARN = 0.5  # WARN when the first loss is more than this many nats above ln V
FIRST_LOSS_FAIL = 2.5  # FAIL when it is above this multiple of ln V
LOGIT_STD = (2.0, 5.0)  # output logit std: WARN above the first, FAIL above the second
ATTENTION_LOGIT = 20.0  # WARN above: attention rows start near one-hot


@check("init-scale", "output scale at initialisation",
       "Initialise weights from normal(0, 0.02) (or 1/sqrt(fan_in)), keep the 1/sqrt(d_k) scale, and check the "
       "first loss is about ln(vocab) before training; see `attnkit lab pitfalls`.", order=115)
def init_scale(subject, options) -> Outcome:
    if options.fresh is False:
        raise Skip(f"{options.not_fresh_because}: the initial scale does not apply to loaded weights")
    lm = subject.lm
    if lm is None or not lm.outputs_logits:
        raise Skip("needs a token model with logits")
    s = subject.cast(torch.float32)
    tokens = tokens_for(lm.vocab_size, 4, 16, gen(options, 22), model_device(s))
    with torch.no_grad(), capture(s.module, scores=True) as cap:
        logits = s.lm.forward(tokens).float()  # (B, L, V)
    pred, target = (logits[:, :-1], tokens[:, 1:]) if lm.causal else (logits, tokens)
    loss = float(F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1)))
    log_v = math.log(lm.vocab_size)
    std = float(logits.std())
    finite = [r.scores[torch.isfinite(r.scores)] for r in cap.records if r.scores is not None]
    att = max((float(f.abs().max()) for f in finite if f.numel()), default=math.nan)
    details = {"first_loss": loss, "log_vocab": log_v, "logit_std": std, "max_attention_logit": att}
    text = (f"first loss {loss:.2f} vs ln(V) {log_v:.2f}, logit std {std:.2f}"
            + (f", max attention logit {att:.1f}" if att == att else ""))
    if loss > FIRST_LOSS_FAIL * log_v or std > LOGIT_STD[1]:
        return Outcome(FAIL, "outputs far too large at init: " + text, details)
    if loss > log_v + FIRST_LOSS_WARN or std > LOGIT_STD[0] or att > ATTENTION_LOGIT:
        return Outcome(WARN, "outputs larger than a uniform start: " + text, details)
    return Outcome(PASS, text + f" (bands: loss <= ln V + {FIRST_LOSS_WARN}, logit std <= {LOGIT_STD[0]})", details)
