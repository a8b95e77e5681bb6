"""Attention dropout: a model meant for training with attention dropout 0.

``attnkit lab pitfalls`` measured the claim behind a warning here (attention dropout narrows the train /
validation gap of a small model on a small dataset) and rated it **does not hold at this scale**: the gap
narrowed by 12% (:data:`LAB_EVIDENCE`), short of the lab's 20% band. So a rate of 0 is reported as INFO (a
setting worth knowing, not a bug), with that measurement; a model not meant for training is SKIPped (dropout
acts only in training).
"""

from __future__ import annotations

from attnkit.diagnostics.checks.base import INFO, PASS, Outcome, Skip, check

#: what the lab measured (attnkit lab pitfalls, default size; docs/labs.md) and its verdict on the claim
LAB_EVIDENCE = ("attnkit lab pitfalls measured a train/validation gap of 0.75 nats with attention dropout 0 vs 0.67 "
                "with 0.1 on 16 KB of text (12% narrower, short of its 20% band: the claim does not hold at this "
                "scale); docs/labs.md")
HF_FIELDS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")


def attention_dropout_rates(module) -> dict[str, float]:
    """``{layer name: rate}`` of attnkit attention modules, or ``{"config.<field>": rate}`` for Hugging Face."""
    from attnkit.diagnostics.subjects import attnkit_attention_modules

    rates = {name: float(m.dropout) for name, m in attnkit_attention_modules(module)
             if isinstance(getattr(m, "dropout", None), (int, float))}
    if rates:
        return rates
    config = getattr(module, "config", None)
    return {f"config.{f}": float(getattr(config, f)) for f in HF_FIELDS
            if isinstance(getattr(config, f, None), (int, float))}


@check("attention-dropout", "attention dropout",
       "Attention dropout is a weak regulariser at small scale (attnkit lab pitfalls); try 0.1 "
       "(LMConfig(dropout=0.1)) only if a small model overfits little data.", order=116)
def attention_dropout(subject, options) -> Outcome:
    module = subject.module
    if module is None:
        raise Skip("needs a model (a bare function has no dropout setting)")
    if options.fresh is False or (options.fresh is None and not module.training):
        raise Skip("not meant for training (loaded weights or a model in eval mode): dropout acts only in training")
    rates = attention_dropout_rates(module)
    if not rates:
        raise Skip("found no attention dropout setting (attnkit attention modules or a Hugging Face config field)")
    zero = [name for name, rate in rates.items() if rate == 0.0]
    details = {"rates": rates, "evidence": LAB_EVIDENCE}
    if zero:
        where = ", ".join(zero[:2]) + (", ..." if len(zero) > 2 else "")
        return Outcome(INFO, f"attention dropout is 0 in {len(zero)} of {len(rates)} settings ({where}); not a bug: "
                       f"{LAB_EVIDENCE}", details)
    return Outcome(PASS, f"attention dropout {min(rates.values()):g}..{max(rates.values()):g} in {len(rates)} settings",
                   details)
