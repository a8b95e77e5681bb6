"""A/B of the Hugging Face glue alone: this checkout's ``integrations/hf`` against another checkout's, in one process.

Both glues run on the *same* ``ak.attention`` (this checkout's), so the ratio is the glue's own gain; transformers'
own implementation is the baseline. Greedy ``generate`` of one ``attnkit bench hf`` family, contenders in a fresh
random order each round, medians of CPU time (``time.process_time``: steadier than wall time on a shared machine).

    git worktree add --detach /tmp/old main             # the glue to compare against
    PYTHONPATH=src OMP_NUM_THREADS=1 python scripts/hf_glue_ab.py --old /tmp/old --family mistral --cache dynamic

``--stub`` adds this checkout's glue with ``ak.attention`` swapped for a direct SDPA call (causal only where the
glue passes a mask: right for LLaMA/GPT-2 with a dynamic cache, and the token check refuses it elsewhere): what the
model would run at if ``ak.attention`` cost nothing over SDPA.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
import types
from pathlib import Path


def _load(name: str, path: str, replace: tuple = ()) -> types.ModuleType:
    source = Path(path).read_text()
    for old, new in replace:
        source = source.replace(old, new)
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="root of the checkout whose src/attnkit/integrations/hf to compare")
    parser.add_argument("--family", default="llama")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--stub", action="store_true", help="also this glue over a direct SDPA call")
    args = parser.parse_args()

    import torch
    import transformers as tf
    from transformers.masking_utils import AttentionMaskInterface

    import attnkit.integrations.hf  # (registers "attnkit")
    from attnkit.bench.hf_generate import FAMILIES

    torch.set_num_threads(1)
    tf.logging.set_verbosity_error()
    glue = f"{args.old}/src/attnkit/integrations/hf/"
    old_masks = _load("old_hf_masks", glue + "masks.py")
    old_attention = _load("old_hf_attention", glue + "attention.py", (
        ("from attnkit.integrations.hf.masks import HFMask", "from old_hf_masks import HFMask"),))
    tf.AttentionInterface.register("attnkit_old", old_attention.attention_forward)
    AttentionMaskInterface.register("attnkit_old", old_masks.mask_interface)

    impls = ["attnkit", "attnkit_old"]
    if args.stub:
        import torch.nn.functional as F

        from attnkit.integrations.hf import attention as glue_module

        def direct_sdpa(q, k, v, mask=None, *, scale=None, **_):  # (B, H, Lq, D) -> (B, H, Lq, D)
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=scale, is_causal=mask is not None)

        glue = glue_module.attention_forward
        stubbed = types.FunctionType(glue.__code__, dict(glue.__globals__, attention=direct_sdpa), glue.__name__,
                                     glue.__defaults__, glue.__closure__)
        stubbed.__kwdefaults__ = glue.__kwdefaults__
        tf.AttentionInterface.register("attnkit_glue_direct_sdpa", stubbed)
        AttentionMaskInterface.register("attnkit_glue_direct_sdpa", attnkit.integrations.hf.mask_interface)
        impls.append("attnkit_glue_direct_sdpa")
    family = FAMILIES[args.family]
    sizes = argparse.Namespace(gen_dim=256, gen_layers=8, heads=8, kv_heads=2, gen_window=32)  # the bench's
    cls = getattr(tf, family.model)
    torch.manual_seed(0)
    config = family.config(tf, sizes)
    base = cls(config).eval()
    models = {}
    for impl in (family.baseline, *impls):
        models[impl] = cls(copy.deepcopy(config)).eval()
        models[impl].load_state_dict(base.state_dict())
        models[impl].set_attn_implementation(impl)
    ids = torch.randint(3, 1024, (1, 16))
    extra = {"cache_implementation": "static"} if args.cache == "static" else {}

    def generate(model):
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0,
                                  eos_token_id=None, **extra)

    want = generate(models[family.baseline])
    for impl, model in models.items():
        if not torch.equal(generate(model), want):
            raise SystemExit(f"{impl}'s greedy tokens differ from {family.baseline}'s")
    seconds = {impl: [] for impl in models}
    for _ in range(args.repeats):
        order = list(models)
        random.shuffle(order)
        for impl in order:
            start = time.process_time()
            generate(models[impl])
            seconds[impl].append(time.process_time() - start)
    median = {impl: statistics.median(s) for impl, s in seconds.items()}
    print(f"{args.family} {args.cache}: " + " | ".join(
        f"{impl} {median[family.baseline] / s:.3f}x" for impl, s in median.items()) + f" ({family.baseline} = 1)")


if __name__ == "__main__":
    main()
