"""``attnkit generate``: sample text from a model with the KV cache.

    attnkit generate runs/demo --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 40
    attnkit generate path/to/hf_model --prompt "Once upon a time" --temperature 0   # through its converted model
    attnkit generate hf-llama-tiny --ids --prompt "1 5 7" --temperature 0          # no tokenizer: token ids

Targets are those of ``attnkit doctor`` and ``report`` (:func:`attnkit.runs.open_source`): a run or checkpoint
folder, a Hugging Face folder (converted as ``attnkit convert`` converts it, with its own tokenizer), a preset or
``hf-*-tiny`` (random weights). ``--checkpoint PATH`` is the older spelling of the target.
"""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="sample text from a model (KV-cached decoding)")
    p.add_argument("target", nargs="?", help="a run/checkpoint folder, a Hugging Face folder, a preset or hf-*-tiny")
    p.add_argument("--checkpoint", help="the target (older spelling): a run folder or a checkpoint folder")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    p.add_argument("--ids", action="store_true", help="prompts are token ids (\"1 5 7\"); print token ids")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static", "sliding"])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.add_argument("--stream", action="store_true", help="print tokens as they are produced (one prompt)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit.models.generation import generate, stream_generate
    from attnkit.runs import open_source

    torch.manual_seed(args.seed)  # the weights of a preset or hf-*-tiny
    from attnkit.training.dist import pick_device

    device = pick_device(args.device)  # a device this machine lacks: a typed error naming --device, before loading
    source = open_source(_target(args), convert=True, device=device)
    tok = IdTokenizer() if args.ids else source.tokenizer
    if tok is None:
        from attnkit.errors import AttnkitValueError

        raise AttnkitValueError(f"{source.target.name!r} has no tokenizer to encode --prompt with; pass the prompt "
                                "as token ids with --ids (e.g. --ids --prompt \"1 5 7\").")
    prompts = [tok.encode(p) for p in args.prompt]
    kwargs = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
              "top_p": args.top_p, "seed": args.seed, "stop_tokens": () if tok.EOS is None else (tok.EOS,),
              "cache": args.cache}
    with torch.inference_mode():
        if args.stream and len(prompts) == 1:
            _stream(stream_generate(source.model, prompts, **kwargs), args.prompt[0], tok)
            return 0
        outputs = generate(source.model, prompts, **kwargs)
    for prompt, new in zip(args.prompt, outputs):
        print(prompt + tok.decode(new))
        if len(outputs) > 1:
            print("-" * 40)
    return 0


def _target(args) -> str:
    if (args.target is None) == (args.checkpoint is None):
        from attnkit.errors import AttnkitValueError

        raise AttnkitValueError(f"generate takes one target, got TARGET={args.target!r} and --checkpoint="
                                f"{args.checkpoint!r}; pass a run folder, a Hugging Face folder, a preset or hf-*-tiny "
                                "once (attnkit generate runs/demo --prompt ...).")
    return args.target or args.checkpoint


def _stream(tokens, prompt: str, tok) -> None:
    sys.stdout.write(prompt)
    pending = []
    for _, token in tokens:
        pending.append(token)
        text = tok.decode(pending)
        if "\ufffd" not in text or len(pending) >= 4:  # wait for complete UTF-8 characters
            sys.stdout.write(text)
            sys.stdout.flush()
            pending = []
    print()


class IdTokenizer:
    """``--ids``: a prompt is token ids separated by spaces or commas; the new tokens print as ids."""

    EOS = None

    def encode(self, text: str) -> list[int]:
        from attnkit.errors import AttnkitValueError

        try:
            return [int(t) for t in text.replace(",", " ").split()]
        except ValueError as exc:
            raise AttnkitValueError(f"--ids: --prompt {text!r} is not token ids; pass ids separated by spaces, "
                                    "e.g. --prompt \"1 5 7\".") from exc

    def decode(self, ids) -> str:
        return "".join(f" {int(i)}" for i in ids)
