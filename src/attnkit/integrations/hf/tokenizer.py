"""attnkit's byte tokenizer (:class:`attnkit.runs.tokens.ByteTokenizer`: UTF-8 bytes 0..255, ``EOS = 256``) as a
transformers tokenizer, so that an exported trained run runs in ``pipeline("text-generation", model=folder)``.

The tokenizer is a ``tokenizers`` BPE without merges over GPT-2's byte-to-character alphabet: the byte-level
pre-tokenizer turns text into its UTF-8 bytes (each shown as one character), every byte is its own token with id =
the byte's value, and ``<eos>`` is the special token 256; decoding maps the ids back to bytes. Nothing is added
around the text (no BOS), as attnkit's trainer saw it.

>>> tok = byte_tokenizer()                                   # doctest: +SKIP
>>> tok("hé")["input_ids"], tok.eos_token_id                  # doctest: +SKIP
([104, 195, 169], 256)
"""

from __future__ import annotations

EOS_TOKEN = "<eos>"


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level pre-tokenizer's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A ``PreTrainedTokenizerFast`` whose ids are attnkit's byte tokens (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from attnkit.integrations.hf._deps import transformers

    vocab = {char: b for b, char in byte_alphabet().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN])  # id 256: after the 256 bytes, as ByteTokenizer.EOS
    return transformers().PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN,
                                                  model_max_length=int(1e30), clean_up_tokenization_spaces=False)
