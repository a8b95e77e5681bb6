"""Attention dropout: a model meant for training with attention dropout 0.

``attnkit lab pitfalls`` measures the train / validation gap of a small model on a small dataset with
attention dropout 0 and 0.1 (:data:`LAB_EVIDENCE`: a 12% narrower gap there, a modest effect); this check
WARNs (never FAILs: large pre-training runs often use 0 on purpose) when a model that is about to be trained
has no attention dropout at all.
"""

from __future__ import annotations

from attnkit.diagnostics.checks.base import PASS, WARN, Outcome, Skip, check

#: the measured gap behind the warning (attnkit lab pitfalls, default size; docs/labs.md)
LAB_EVIDENCE = ("attnkit lab pitfalls measured a train/validation gap of 0.75 nats with attention dropout 0 vs 0.67 "
                "with 0.1 on 16 KB of text; docs/labs.md")
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
       "Set attention dropout (LMConfig(dropout=0.1) or MultiHeadAttention(dropout=0.1)) when training a small "
       "model on little data; 0 is a deliberate choice only for large data.", order=116)
def attention_dropout(subject, options) -> Outcome:
    module = subject.module
    if module is None:
        raise Skip("needs a model (a bare function has no dropout setting)")
    if options.fresh is False or (options.fresh is None and not module.training):
        raise Skip("not meant for training (a trained model or one in eval mode): dropout acts only in training")
    rates = attention_dropout_rates(module)
    if not rates:
        raise Skip("found no attention dropout setting (attnkit attention modules or a Hugging Face config field)")
    zero = [name for name, rate in rates.items() if rate == 0.0]
    details = {"rates": rates, "evidence": LAB_EVIDENCE}
    if zero:
        where = ", ".join(zero[:2]) + (", ..." if len(zero) > 2 else "")
        return Outcome(WARN, f"attention dropout is 0 in {len(zero)} of {len(rates)} settings ({where}): a small "
                       f"model on little data overfits ({LAB_EVIDENCE})", details)
    return Outcome(PASS, f"attention dropout {min(rates.values()):g}..{max(rates.values()):g} in {len(rates)} settings",
                   details)
