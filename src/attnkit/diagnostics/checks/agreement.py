"""Agreement of every backend (attnkit backends, Hugging Face attention implementations, or a bare function) with
the float64 reference, by the tolerance rule of docs/conventions.md (2x the reference's own float32 error).

Shape legend: B batch, H heads, L length, D head_dim.
"""

from __future__ import annotations

import torch

from attnkit._tolerance import max_error, within_rule
from attnkit.diagnostics.checks.base import (
    FAIL,
    PASS,
    Outcome,
    Skip,
    check,
    gen,
    precise,
    randn,
    run_main,
    sample_inputs,
    tolerance,
)
from attnkit.diagnostics.checks.numerics import _hf_implementations
from attnkit.diagnostics.subjects import attnkit_attention_modules
from attnkit.functional.reference import reference_attention


def _judge(out: torch.Tensor, ref: torch.Tensor, golden: torch.Tensor, tol: float | None) -> dict:
    """One served result: by the tolerance rule of docs/conventions.md (``attnkit._tolerance``) against a float64
    ``golden`` (``tol`` None), else within ``tol`` of a golden in the dtype the model runs (:func:`precise`)."""
    if tol is None:
        result = within_rule(out, ref, golden)
        return {"served": True, "ok": result.ok, "err": result.err, "ref_err": result.ref_err}
    err = max_error(out, golden)
    return {"served": True, "ok": err <= tol, "err": err, "ref_err": 0.0}


def _tol(golden: torch.Tensor, probe) -> float | None:
    """None when ``golden`` is float64 (the rule judges); else the tolerance of the dtype the model runs in."""
    return None if probe.dtype == torch.float64 else tolerance(golden.to(probe.dtype))


def _not_here(name: str, device: torch.device, pinned: list[str]) -> str | None:
    """Why backend ``name`` is left out of the comparison on ``device`` (None: it is compared). Flex compiles for
    seconds per shape on CPU; it is compared there only when the model pins it or CPU compiling is allowed,
    which is when the model would ever run it."""
    if name != "flex" or device.type != "cpu" or "flex" in pinned:
        return None
    from attnkit.backends.flex import cpu_compile_allowed

    if cpu_compile_allowed():
        return None
    return ("not compared on CPU: flex compiles for seconds per shape there and the model does not use it (it is "
            "compared when the model pins backend='flex' or after ak.backends.flex.allow_cpu_compile())")


def _set_backends(module, name: str) -> list[str]:
    mods = [m for _, m in attnkit_attention_modules(module)]
    old = [m.backend for m in mods]
    for m in mods:
        m.backend = name
    return old


def _agree_attnkit(subject, options) -> tuple[dict[str, dict], str, float | None]:
    """Every attnkit backend on the float32 model vs the float64 model on the math backend (the model in the most
    precise dtype it runs, :func:`precise`, when it refuses float64)."""
    import attnkit

    results: dict[str, dict] = {}
    probe = precise(subject, options)
    s64, s32 = probe.subject, subject.cast(torch.float32)
    inputs = sample_inputs(s32, options)
    old64, old32 = _set_backends(s64.module, "math"), _set_backends(s32.module, "math")
    try:
        with torch.no_grad():
            golden = run_main(s64, inputs.to(probe.dtype) if inputs.is_floating_point() else inputs).double()
            tol = _tol(golden, probe)
            ref = run_main(s32, inputs)
            for name in attnkit.backends.available():
                if (why := _not_here(name, inputs.device, old32)) is not None:
                    results[name] = {"served": False, "why": why}
                    continue
                _set_backends(s32.module, name)
                try:
                    out = run_main(s32, inputs)
                except NotImplementedError as exc:
                    results[name] = {"served": False, "why": str(exc)}
                    continue
                results[name] = _judge(out, ref, golden, tol)
    finally:
        for s, old in ((s64, old64), (s32, old32)):
            for (_, m), b in zip(attnkit_attention_modules(s.module), old):
                m.backend = b
    if tol is None:
        return results, "model output per attnkit backend vs float64 math", None
    return results, f"model output per attnkit backend vs math{probe.note}", tol


def _agree_hf(subject, options) -> tuple[dict[str, dict], str, float | None]:
    """Every Hugging Face attention implementation vs float64 eager by the rule; vs eager in the most precise dtype the
    model runs (:func:`precise`) by that dtype's tolerance when it refuses float64. An implementation the model
    refuses, or one that raises on the model's attention (SDPA on softcapping), can't serve it: said, not failed."""
    results: dict[str, dict] = {}
    probe = precise(subject, options)
    s_ref, s32 = probe.subject, subject.cast(torch.float32)
    inputs = sample_inputs(s32, options)
    originals = [(m, m.config._attn_implementation) for m in (s_ref.module, s32.module)]  # either may be yours
    with torch.no_grad():
        try:
            golden = _run_as(s_ref, "eager", inputs).double()
            ref = _run_as(s32, "eager", inputs)
            tol = _tol(golden, probe)
            for name in _hf_implementations():
                try:
                    out = _run_as(s32, name, inputs)
                except Exception as exc:  # noqa: BLE001 - refused by the model or the implementation
                    results[name] = {"served": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
                    continue
                results[name] = _judge(out, ref, golden, tol)
        finally:
            for module, original in originals:
                module.set_attn_implementation(original)
    if tol is None:
        return results, "Hugging Face attention implementations vs float64 eager", None
    return results, f"Hugging Face attention implementations vs eager{probe.note}", tol


def _run_as(s, implementation: str, inputs) -> torch.Tensor:
    s.module.set_attn_implementation(implementation)
    return run_main(s, inputs)


def _agree_function(subject, options) -> tuple[dict[str, dict], str, None]:
    """The bare function in float32 vs the float64 reference, unmasked, causal and padded."""
    results: dict[str, dict] = {}
    g = gen(options, 11)
    B, H, L, D = options.batch, options.heads, options.seq_len, options.head_dim
    q, k, v = (randn((B, H, L, D), g) for _ in range(3))
    real = torch.ones(B, L, dtype=torch.bool)
    real[0, -2:] = False
    with torch.no_grad():
        for name, mask in (("no mask", None), ("causal", torch.ones(L, L, dtype=torch.bool).tril()),
                           ("padding", real[:, None, None, :])):
            golden = reference_attention(q, k, v, mask)
            ref = reference_attention(q.float(), k.float(), v.float(), mask)
            results[name] = _judge(subject.fn(q.float(), k.float(), v.float(), mask), ref, golden, None)
    return results, "the function in float32 vs the float64 reference", None


@check("backend-agreement", "backend agreement",
       "The result disagrees with the float64 reference beyond 2x the reference's own float32 error: compare the "
       "implementation term by term with ak.reference_attention; for an attnkit backend, pin backend='math' and "
       "report the case (ak.explain shows which kernel served it).", order=90)
def backend_agreement(subject, options) -> Outcome:
    if subject.uses_attnkit and (subject.seq is not None or subject.lm is not None):
        results, what, tol = _agree_attnkit(subject, options)
    elif subject.kind == "huggingface":
        results, what, tol = _agree_hf(subject, options)
    elif subject.fn is not None and subject.kind == "function":
        results, what, tol = _agree_function(subject, options)
    else:
        raise Skip("no attnkit backends or attention implementations to compare (and no bare function)")
    bad = [n for n, r in results.items() if r.get("served") and not r["ok"]]
    served = {n: r for n, r in results.items() if r.get("served")}  # the reference (math, eager) always serves
    text = ", ".join(f"{n} {r['err']:.1e}" for n, r in served.items())
    ref_err = max(r["ref_err"] for r in served.values())
    # judged by the rule against float64 (tol None), or by the tolerance of the dtype the model runs in
    limit = "2x the reference error" if tol is None else f"tol {tol:.0e}"
    yardstick = f"float32 reference {ref_err:.1e}" if tol is None else f"tol {tol:.0e}"
    extra = _unserved_text(results)
    extra = f"; {extra}" if extra else ""
    if bad:
        return Outcome(FAIL, f"{', '.join(bad)} outside {limit} ({what}: {text}; {yardstick}){extra}", results)
    return Outcome(PASS, f"{what}: {text} ({yardstick}, within {'2x' if tol is None else 'it'}){extra}", results)


def _unserved_text(results: dict[str, dict]) -> str:
    """What was left out and why: backends that can't serve the call, and those not compared on purpose."""
    parts = []
    for name, r in results.items():
        if r.get("served"):
            continue
        why = r["why"]
        parts.append(f"{name} {why}" if why.startswith("not compared") else f"{name} can't serve it ({why})")
    return "; ".join(parts)
