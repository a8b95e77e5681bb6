"""``attnkit generate``: sample text from a model with the KV cache.

    attnkit generate runs/demo --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 40
    attnkit generate path/to/hf_model --prompt "Once upon a time" --temperature 0   # through its converted model
    attnkit generate hf-llama-tiny --ids --prompt "1 5 7" --temperature 0          # no tokenizer: token ids

Targets are those of ``attnkit doctor`` and ``report`` (:func:`attnkit.runs.open_source`): a run or checkpoint
folder, a Hugging Face folder (converted as ``attnkit convert`` converts it, with its own tokenizer), a preset or
``hf-*-tiny`` (random weights). ``--checkpoint PATH`` is the older spelling of the target.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings

from attnkit._progress import progress
from attnkit.cli.flags import as_typed, flag


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
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="print tokens as they are produced (one prompt; default: on a terminal)")
    p.set_defaults(run=run)


def check_flags(args) -> None:
    """The flags' own values, named as typed, before a model is loaded: generate's rules
    (:func:`attnkit.models.generation.check_sampling`) with the flags' names, and the command's own flags."""
    from attnkit.errors import AttnkitValueError
    from attnkit.models.generation import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, names=flag)  # the library's rules
    if args.stream and len(args.prompt) > 1:
        raise AttnkitValueError(f"--stream prints one prompt's tokens as they come, got {len(args.prompt)} --prompt; "
                                "pass one --prompt, or leave --stream out to print each completion when done.")


def run(args) -> int:
    check_flags(args)
    import torch

    from attnkit.models.generation import stream_generate
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
    prompts = [_encode(tok, text) for text in args.prompt]
    kwargs = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
              "top_p": args.top_p, "seed": args.seed, "stop_tokens": () if tok.EOS is None else (tok.EOS,),
              "cache": args.cache}
    with _length_warnings():  # said before the first token (the arguments are checked when called)
        tokens = stream_generate(source.model, prompts, **kwargs)
    with torch.inference_mode():
        stream = args.stream if args.stream is not None else len(prompts) == 1 and sys.stdout.isatty()
        if stream:
            _stream(tokens, prompts[0], tok)
            return 0
        outputs = [list(p) for p in prompts]  # prompt and continuation decoded together (the tokenizer's spacing)
        for row, token in progress(tokens, desc="generate", unit="token", total=len(prompts) * args.max_new_tokens):
            outputs[row].append(token)
    for ids in outputs:
        print(tok.decode(ids))
        if len(outputs) > 1:
            print("-" * 40)
    return 0


def _encode(tok, text: str) -> list[int]:
    ids = tok.encode(text)
    if not ids:
        from attnkit.errors import AttnkitValueError

        raise AttnkitValueError(f"--prompt {text!r} has no tokens; give every --prompt some text to continue, e.g. "
                                "--prompt \"def \".")
    return ids


@contextlib.contextmanager
def _length_warnings():
    """The library's warning of a length past what the model was trained on, printed as this command's."""
    from attnkit.models.generation import LengthWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LengthWarning)
        yield
    for warning in caught:
        if issubclass(warning.category, LengthWarning):
            text = as_typed(str(warning.message), "generate")  # the flags as typed
            print(f"attnkit generate: warning: {text}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def _target(args) -> str:
    if (args.target is None) == (args.checkpoint is None):
        from attnkit.errors import AttnkitValueError

        raise AttnkitValueError(f"generate takes one target, got TARGET={args.target!r} and --checkpoint="
                                f"{args.checkpoint!r}; pass a run folder, a Hugging Face folder, a preset or hf-*-tiny "
                                "once (attnkit generate runs/demo --prompt ...).")
    return args.target or args.checkpoint


def _stream(tokens, prompt: list[int], tok) -> None:
    """Print the prompt, then each token as it comes: the text is decoded from every id so far (the tokenizer's
    spacing between tokens), and printed once its characters are complete."""
    ids = list(prompt)
    shown = tok.decode(ids)
    sys.stdout.write(shown)
    waiting = 0
    for _, token in tokens:
        ids.append(token)
        text = tok.decode(ids)
        waiting += 1
        if text.endswith("\ufffd") and waiting < 4:  # wait for complete UTF-8 characters
            continue
        sys.stdout.write(text[len(shown):] if text.startswith(shown) else tok.decode(ids[-waiting:]))
        sys.stdout.flush()
        shown, waiting = text, 0
    if waiting:
        sys.stdout.write(tok.decode(ids)[len(shown):])
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
        return " ".join(str(int(i)) for i in ids)
