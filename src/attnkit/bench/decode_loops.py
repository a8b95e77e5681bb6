"""The greedy decoding loops that ``attnkit bench decode`` races against attnkit's ``generate``: the ceiling for
any library built from PyTorch ops (:func:`bare_torch_greedy`: bare functional calls on a model's weights), the
static-cache decode step ``torch.compile``d (:class:`CompiledGreedy`) and its bare baseline
(:class:`BareCompiledGreedy`). Each returns the new tokens; the suite checks they agree before it times them.

Shape legend: B batch, P prompt length, N new tokens, T max length, L tokens in a call, E width, H heads,
D head dim, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit.models.lm import TransformerLM


def bare_torch_greedy(model: TransformerLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The ceiling for any library built from PyTorch ops: greedy decoding of ``model`` (learned positions) as
    one loop of bare functional calls on its weights - no modules, no checks, preallocated K/V - ``(B, N)``."""
    B, P = prompt.shape
    E, H = model.embed.weight.shape[1], model.config.num_heads
    D, T = E // H, P + new_tokens
    blocks = [(b.norm1, b.attn.qkv_proj, b.attn.out_proj, b.norm2, b.mlp.up, b.mlp.down) for b in model.blocks]
    K = [torch.empty(B, H, T, D) for _ in blocks]  # (B, H, T, D) per layer
    V = [torch.empty(B, H, T, D) for _ in blocks]
    ln = lambda x, m: F.layer_norm(x, (E,), m.weight, m.bias)  # noqa: E731

    def forward(tokens, start):  # tokens (B, L) at positions start.. -> last logits (B, V)
        L = tokens.shape[1]
        x = F.embedding(tokens, model.embed.weight) + model.pos_embed.embedding.weight[start:start + L]  # (B, L, E)
        for i, (ln1, qkv, out, ln2, fc, proj) in enumerate(blocks):
            q, k, v = F.linear(ln(x, ln1), qkv.weight, qkv.bias).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, L, D) x3
            K[i][:, :, start:start + L], V[i][:, :, start:start + L] = k, v
            a = F.scaled_dot_product_attention(q, K[i][:, :, :start + L], V[i][:, :, :start + L], is_causal=L > 1)
            x = x + F.linear(a.transpose(1, 2).reshape(B, L, E), out.weight, out.bias)  # (B, L, E)
            h = F.gelu(F.linear(ln(x, ln2), fc.weight, fc.bias), approximate="tanh")
            x = x + F.linear(h, proj.weight, proj.bias)
        return F.linear(ln(x[:, -1], model.norm), model.embed.weight)  # (B, V)

    with torch.inference_mode():
        tok = forward(prompt, 0).argmax(-1, keepdim=True)  # (B, 1)
        out = [tok]
        for t in range(P, T - 1):
            tok = forward(tok, t).argmax(-1, keepdim=True)
            out.append(tok)
    return torch.cat(out, dim=1)  # (B, N)


class CompiledGreedy:
    """Greedy decoding with a static cache whose decode step is ``torch.compile``d (one graph for every step;
    the prefill runs eager). The caches are reused (``reset``) across calls so the graph is reused too. The
    steps pass no positions, as ``generate(compile=True)`` does: the caches continue their own."""

    def __init__(self, model: TransformerLM, batch: int, max_length: int):
        self.model, self.caches = model, model.new_cache(batch, kind="static", max_length=max_length)
        self.step = torch.compile(lambda t: model(t, cache=self.caches), dynamic=False)

    def __call__(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        B, P = prompt.shape
        for cache in self.caches:
            cache.reset()
        with torch.inference_mode():
            logits = self.model(prompt, positions=torch.arange(P)[None], cache=self.caches, logits_to_keep=1)  # (B, 1, V)
            tok = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out = [tok]
            for _ in range(new_tokens - 1):
                tok = self.step(tok)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
                out.append(tok)
        return torch.cat(out, dim=1)  # (B, N)


class BareCompiledGreedy:
    """:func:`bare_torch_greedy` with attnkit's static-cache layout: K/V preallocated ``(B, H, T, D)`` per layer,
    the write slot a tensor (``index_copy_``), every slot attended under a ``key position <= query position``
    mask, and the decode step ``torch.compile``d (one graph; the prefill runs eager). The baseline for
    :class:`CompiledGreedy`."""

    def __init__(self, model: TransformerLM, batch: int, max_length: int):
        E, H = model.embed.weight.shape[1], model.config.num_heads
        self.model, self.B, self.E, self.H, self.D, self.T = model, batch, E, H, E // H, max_length
        self.blocks = [(b.norm1, b.attn.qkv_proj, b.attn.out_proj, b.norm2, b.mlp.up, b.mlp.down) for b in model.blocks]
        self.K = [torch.zeros(batch, H, max_length, E // H) for _ in self.blocks]  # (B, H, T, D) per layer
        self.V = [torch.zeros(batch, H, max_length, E // H) for _ in self.blocks]
        self.slots = torch.arange(max_length)  # (T,)
        self.step = torch.compile(self.forward, dynamic=False)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens ``(B, L)`` at positions ``pos (L,)`` -> last logits ``(B, V)``."""
        model, B, E, H, D = self.model, self.B, self.E, self.H, self.D
        L = tokens.shape[1]
        x = F.embedding(tokens, model.embed.weight) + model.pos_embed.embedding.weight[pos]  # (B, L, E)
        visible = (self.slots[None, :] <= pos[:, None])[None, None]  # (1, 1, L, T)
        for i, (ln1, qkv, out, ln2, fc, proj) in enumerate(self.blocks):
            h = F.layer_norm(x, (E,), ln1.weight, ln1.bias)
            q, k, v = F.linear(h, qkv.weight, qkv.bias).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, L, D) x3
            self.K[i].index_copy_(2, pos, k)
            self.V[i].index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, self.K[i], self.V[i], attn_mask=visible)  # (B, H, L, D)
            x = x + F.linear(a.transpose(1, 2).reshape(B, L, E), out.weight, out.bias)  # (B, L, E)
            h = F.gelu(F.linear(F.layer_norm(x, (E,), ln2.weight, ln2.bias), fc.weight, fc.bias), approximate="tanh")
            x = x + F.linear(h, proj.weight, proj.bias)
        return F.linear(F.layer_norm(x[:, -1], (E,), model.norm.weight, model.norm.bias), model.embed.weight)

    def __call__(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        P = prompt.shape[1]
        with torch.inference_mode():
            tok = self.forward(prompt, torch.arange(P)).argmax(-1, keepdim=True)  # (B, 1)
            out = [tok]
            for i in range(new_tokens - 1):
                tok = self.step(tok, torch.tensor([P + i])).argmax(-1, keepdim=True)  # (B, 1)
                out.append(tok)
        return torch.cat(out, dim=1)  # (B, N)
