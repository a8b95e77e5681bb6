"""Which heads matter: rank every attention head by how much an objective worsens when that head alone is
removed (:class:`attnkit.diagnostics.ablation.ablate`), on the user's own model and text.

>>> import torch
>>> from attnkit.models.builders import build_lm
>>> from attnkit.diagnostics.importance import head_importance
>>> result = head_importance(build_lm("nano").eval(), torch.randint(0, 257, (1, 16)))
>>> tuple(result.scores.shape), result.objective
((2, 2), 'lm-loss')

Objectives (``objective=``; ``"auto"`` picks by the model):

- ``"lm-loss"`` (causal LMs): the mean next-token cross-entropy (nats) of ``tokens`` (every position but the
  last predicts the next). ``baseline`` = the intact model's loss; a score = loss with the head removed - baseline.
- ``"embedding-cosine"`` (encoders: BERT, MiniLM, attnkit encoders): ``1 - cos(e_removed, e)``, where ``e`` is
  the sentence embedding, the mean over positions of the final hidden states (sentence-transformers' mean
  pooling; its L2 normalisation does not change a cosine), averaged over the batch. ``baseline`` = 0 (the intact
  model against itself; 1 - cos is clamped at 0, as a rounding may make cos exceed 1). Why this and not
  masked-LM loss: an encoder is used for its embedding, and the sentence-embedding checkpoints
  (all-MiniLM-L6-v2) ship no masked-LM head, so a masked-LM loss would be read through a randomly initialised
  head; the cosine measures the change a user of the embedding sees.
- a callable ``f(model, tokens) -> float`` (higher = worse): any model and input; scores are ``f`` with the
  head removed minus ``f`` intact.

Cost: one forward per head plus one (``layers x heads + 1`` forwards), under ``torch.no_grad`` in eval mode.

Shape legend: B batch, L length, E hidden width, V vocabulary; layers x heads for the scores.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.diagnostics.ablation import MODES, ablate, record_heads
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe


@dataclass(frozen=True)
class Objective:
    """``measure(model, tokens) -> Tensor`` runs the model; ``value(measured, intact) -> float`` is the objective
    of a measurement given the intact model's (higher = worse)."""

    name: str
    description: str
    measure: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    value: Callable[[torch.Tensor, torch.Tensor], float]


OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    OBJECTIVES[objective.name] = objective
    return objective


def _is_hf(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and hasattr(model, "config")


def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``(B, L, V)``."""
    out = model(input_ids=tokens) if _is_hf(model) else model(tokens)
    logits = getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise AttnkitValueError(f"objective='lm-loss' needs logits (B, L, V) from {type(model).__name__}, got "
                                f"{describe(logits)}; pass objective='embedding-cosine' or a callable.")
    return logits


def _hidden(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The final hidden states ``(B, L, E)``."""
    if _is_hf(model):
        out = model(input_ids=tokens, output_hidden_states=True)
        states = getattr(out, "hidden_states", None)
        return states[-1] if states else out.last_hidden_state
    if callable(getattr(model, "encode", None)):
        return model.encode(tokens)
    raise AttnkitValueError(f"objective='embedding-cosine' needs final hidden states, and {type(model).__name__} "
                            "has no encode(tokens); pass objective=callable(model, tokens) -> float.")


def _lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = _logits(model, tokens)  # (B, L, V)
    V = logits.shape[-1]
    logits = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))  # (B, L-1, V)
    return F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))  # every position predicts the next


def _embedding(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return _hidden(model, tokens).double().mean(dim=1)  # (B, L, E) -> (B, E): mean pooling


register_objective(Objective("lm-loss", "next-token cross-entropy (nats)", _lm_loss, lambda m, intact: float(m)))
register_objective(Objective(
    "embedding-cosine", "1 - cosine of the mean-pooled sentence embedding to the intact model's", _embedding,
    lambda m, intact: float((1 - F.cosine_similarity(m, intact, dim=-1)).clamp_min(0).mean())))


def _causal(model: nn.Module) -> bool | None:
    config = getattr(model, "config", None)
    if _is_hf(model):  # only then: the encoder list imports transformers (attnkit's own runs do without it)
        from attnkit.integrations.hf.folders import HF_ENCODER_TYPES

        return bool(getattr(config, "is_decoder", False)) or config.model_type not in HF_ENCODER_TYPES
    causal = getattr(config, "causal", None)
    return causal if isinstance(causal, bool) else None


def resolve_objective(model: nn.Module, objective) -> Objective:
    """The :class:`Objective` for ``objective`` (a registered name, ``"auto"`` or a callable)."""
    if callable(objective) and not isinstance(objective, str):
        name = getattr(objective, "__name__", type(objective).__name__)
        return Objective(f"custom: {name}", f"{name}(model, tokens)", objective, lambda m, intact: float(m))
    if objective == "auto":
        causal = _causal(model)
        if causal is None:
            raise AttnkitValueError(f"objective='auto' can't tell whether {type(model).__name__} is a causal LM or an "
                                    f"encoder; pass objective= one of {sorted(OBJECTIVES)} or a callable "
                                    "f(model, tokens) -> float.")
        objective = "lm-loss" if causal else "embedding-cosine"
    if objective not in OBJECTIVES:
        raise AttnkitValueError(f"objective={objective!r} is not known; use 'auto', one of {sorted(OBJECTIVES)}, or "
                                "a callable f(model, tokens) -> float (higher = worse).")
    return OBJECTIVES[objective]


@dataclass
class HeadImportance:
    """``scores`` ``(layers, heads)`` float64: the objective with that head removed minus ``baseline`` (the
    intact model's objective); higher = the head matters more. NaN where a layer has fewer heads (or did not
    run). :meth:`ranking`, :meth:`to_dict` and :meth:`figure` present them."""

    scores: torch.Tensor
    objective: str
    ablation: str
    baseline: float
    description: str = ""
    length: int = 0

    @property
    def unit(self) -> str:
        """What a score measures, for axis labels."""
        return "loss increase (nats)" if self.objective == "lm-loss" else f"{self.objective} increase"

    def ranking(self) -> list[tuple[tuple[int, int], float]]:
        """``[((layer, head), score), ...]``, most important first."""
        flat = [((i, h), float(s)) for i, row in enumerate(self.scores) for h, s in enumerate(row)
                if not torch.isnan(s)]
        return sorted(flat, key=lambda item: -item[1])

    def to_dict(self) -> dict:
        return {"objective": self.objective, "description": self.description, "ablation": self.ablation,
                "baseline": self.baseline, "tokens": self.length, "scores": self.scores.tolist(),
                "ranking": [{"layer": lh[0], "head": lh[1], "score": s} for lh, s in self.ranking()]}

    def figure(self, path: str | Path | None = None, *, name: str | None = None, title: str | None = None,
               overwrite: bool = False):
        """A layers x heads heatmap of the scores with labelled axes and a colour bar; saved as PNG when ``path``
        is given (by :func:`attnkit.diagnostics.viz.save_png`'s rules: a ``.png``, never through a link, never over
        a file attnkit did not write unless ``overwrite``, atomic); ``name`` (the model) heads the default title.
        Returns the figure."""
        from attnkit import _files
        from attnkit.diagnostics.viz import PNG, _plt, save_png

        if path is not None:
            _files.check_out(path, PNG, overwrite, option="path")  # before drawing: a typo costs nothing
        plt = _plt()
        n_layers, n_heads = self.scores.shape
        fig, ax = plt.subplots(figsize=(max(5.5, 2.2 + 0.55 * n_heads), max(3.4, 1.8 + 0.42 * n_layers)),
                               constrained_layout=True)
        finite = self.scores.nan_to_num()
        span = max(float(finite.abs().max()), 1e-12)
        signed = float(finite.min()) < 0  # a head whose removal helps: a diverging scale centred on 0
        im = ax.imshow(self.scores.float().numpy(), cmap="RdBu_r" if signed else "Reds",
                       vmin=-span if signed else 0.0, vmax=span, aspect="auto")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        if n_layers * n_heads <= 16 * 16:
            for (i, h), value in ((lh, float(self.scores[lh])) for lh in itertools.product(range(n_layers),
                                                                                            range(n_heads))):
                if value == value:  # not NaN
                    ax.text(h, i, f"{value:.2g}", ha="center", va="center", fontsize=6,
                            color="white" if abs(value) > 0.6 * span else "black")
        fig.colorbar(im, ax=ax).set_label(self.unit, fontsize=8)
        default = (f"{name + ': ' if name else ''}head importance, {self.ablation} ablation of one head at a time, "
                   f"{self.length} tokens\nobjective {self.objective}: {self.description} (intact: {self.baseline:.4g})")
        ax.set_title(title or default, fontsize=8)
        if path is not None:
            try:
                save_png(fig, path, overwrite=overwrite, dpi=120)
            finally:
                plt.close(fig)
        return fig


@contextmanager
def _through_attnkit(model: nn.Module):
    """Run a Hugging Face model's attention through attnkit for the block (restored after)."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not _is_hf(model) or "attnkit" in str(current):
        yield
        return
    from attnkit.integrations.hf import NAME

    try:
        model.set_attn_implementation(NAME)
    except Exception as exc:  # noqa: BLE001 - transformers raises several types for an unsupported architecture
        raise BackendUnsupportedError(
            f"{type(model).__name__} can't run its attention through attnkit ({type(exc).__name__}: {exc}); head "
            "ablation edits attnkit's per-head outputs, so it needs attn_implementation='attnkit'.",
            ["attn_implementation='attnkit'"]) from exc
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def head_importance(model: nn.Module, tokens: torch.Tensor, *, objective="auto", ablation: str = "zero") -> HeadImportance:
    """Score every head of ``model`` on ``tokens`` ``(B, L)`` (or any input a callable objective takes) by the
    objective's change when that head alone is ablated (``"zero"`` or ``"mean"``, see
    :class:`~attnkit.diagnostics.ablation.ablate`). See the module docstring for the objectives."""
    if not isinstance(model, nn.Module):
        raise AttnkitTypeError(f"model must be a torch.nn.Module, got {describe(model)}.")
    if ablation not in MODES:
        raise AttnkitValueError(f"ablation={ablation!r} is not an ablation; use one of {list(MODES)}.")
    obj = resolve_objective(model, objective)
    if obj.name in OBJECTIVES and (not isinstance(tokens, torch.Tensor) or tokens.dim() != 2
                                   or tokens.dtype not in (torch.int64, torch.int32) or tokens.shape[1] < 2):
        raise AttnkitValueError(f"tokens must be token ids (B, L) with L >= 2, got {describe(tokens)}; e.g. "
                                "tokens[None] for one sequence.")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _through_attnkit(model):
            with record_heads(model) as rec:
                intact = obj.measure(model, tokens)
            if not rec.outputs:
                raise AttnkitValueError(f"no attention call of {type(model).__name__} went through "
                                        "attnkit.attention, so no head can be ablated; build the model from attnkit "
                                        "modules, or load a Hugging Face model with attn_implementation='attnkit'.")
            baseline = obj.value(intact, intact)
            heads = [rec.outputs[i].shape[1] if i in rec.outputs else 0 for i in range(max(rec.outputs) + 1)]
            scores = torch.full((len(heads), max(heads)), float("nan"), dtype=torch.float64)  # NaN: no such head
            for layer, n in enumerate(heads):
                for head in range(n):
                    with ablate(model, [(layer, head)], ablation):
                        scores[layer, head] = obj.value(obj.measure(model, tokens), intact) - baseline
    finally:
        model.train(was_training)
    length = int(tokens.shape[-1]) if isinstance(tokens, torch.Tensor) and tokens.dim() >= 1 else 0
    return HeadImportance(scores, obj.name, ablation, float(baseline), obj.description, length)
