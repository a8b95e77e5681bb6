"""``attnkit generate``: sample text from a trained checkpoint with the KV cache.

    attnkit generate --checkpoint runs/demo --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 40
"""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="sample text from a trained checkpoint (KV-cached decoding)")
    p.add_argument("--checkpoint", required=True, help="a run folder (its newest checkpoint) or a checkpoint folder")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static", "sliding"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--stream", action="store_true", help="print tokens as they are produced (one prompt)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit.integrations.runs import run_tokenizer
    from attnkit.models.generation import generate, stream_generate
    from attnkit.models.io import ByteTokenizer, load_model

    model = load_model(args.checkpoint, args.device)
    tok = run_tokenizer(args.checkpoint) or ByteTokenizer()  # a converted run speaks its model's tokens
    prompts = [tok.encode(p) for p in args.prompt]
    check_length(model, prompts, args.max_new_tokens)
    kwargs = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
              "top_p": args.top_p, "seed": args.seed, "stop_tokens": () if tok.EOS is None else (tok.EOS,),
              "cache": args.cache}
    with torch.inference_mode():
        if args.stream and len(prompts) == 1:
            sys.stdout.write(args.prompt[0])
            pending = []
            for _, token in stream_generate(model, prompts, **kwargs):
                pending.append(token)
                text = tok.decode(pending)
                if "\ufffd" not in text or len(pending) >= 4:  # wait for complete UTF-8 characters
                    sys.stdout.write(text)
                    sys.stdout.flush()
                    pending = []
            print()
            return 0
        outputs = generate(model, prompts, **kwargs)
    for prompt, new in zip(args.prompt, outputs):
        print(prompt + tok.decode(new))
        if len(outputs) > 1:
            print("-" * 40)
    return 0


def check_length(model, prompts, max_new_tokens: int) -> None:
    """Refuse up front (not after printing half the text) a prompt + new tokens beyond the positions the model
    has: learned position embeddings hold ``max_positions`` positions."""
    from attnkit.errors import AttnkitValueError

    limit = getattr(getattr(model, "pos_embed", None), "max_positions", None)
    longest = max(len(p) for p in prompts)
    if isinstance(limit, int) and isinstance(max_new_tokens, int) and longest + max_new_tokens > limit:
        raise AttnkitValueError(
            f"--max-new-tokens {max_new_tokens} with a prompt of {longest} tokens needs {longest + max_new_tokens} "
            f"positions, but the model's learned positions hold {limit}; pass --max-new-tokens "
            f"{max(limit - longest, 0)} or less.")
