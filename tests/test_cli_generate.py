"""``attnkit generate``: streams by default to a terminal, prompt and continuation decoded together, progress on a
non-terminal, the length warning as the command's own (issue 23 items 2, 3, 5)."""

import sys

from attnkit.cli import generate as cli_generate
from attnkit.cli.main import main

ARGS = ["generate", "nano", "--prompt", "def ", "--max-new-tokens", "24", "--temperature", "0"]


class WordTokenizer:
    """Words as ids, decoded with a space between words (no space of its own in any token): what
    SentencePiece-style tokenizers do, where decoding the continuation alone loses the space."""

    EOS = None
    words = ["Once", "upon", "a", "time", "independent", "\u00e9t\u00e9"]

    def encode(self, text):
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_stream_decodes_prompt_and_continuation_together(capsys):
    tok = WordTokenizer()
    cli_generate._stream(iter([(0, 4), (0, 5)]), tok.encode("Once upon a time"), tok)
    assert capsys.readouterr().out == "Once upon a time independent \u00e9t\u00e9\n"  # not "timeindependent"


def test_generate_streams_by_default_on_a_terminal_and_prints_the_same_text(monkeypatch, capsys):
    streamed = []
    real = cli_generate._stream
    monkeypatch.setattr(cli_generate, "_stream", lambda *a: streamed.append(1) or real(*a))
    assert main([*ARGS, "--no-stream"]) == 0
    plain = capsys.readouterr().out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(ARGS) == 0
    assert streamed == [1] and capsys.readouterr().out == plain and plain.startswith("def ")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert main(ARGS) == 0 and streamed == [1]  # not a terminal: printed when done


def test_generate_shows_progress_lines_on_a_non_terminal(monkeypatch, capsys):
    monkeypatch.setattr("attnkit._progress.DELAY", 0.0)  # a line from the first token on (normally after 3 s)
    monkeypatch.setenv("ATTNKIT_PROGRESS", "plain")
    assert main([*ARGS, "--no-stream"]) == 0
    err = capsys.readouterr().err
    assert "generate: 1/24 tokens" in err and "generate: 24/24 tokens, done in" in err


def test_generate_past_the_models_length_warns_naming_the_flag(capsys):
    assert main([*ARGS[:4], "--max-new-tokens", "130", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("attnkit generate: warning: a prompt of 4 tokens + --max-new-tokens 130 reaches position "
                          "134, past the 128 the model was built for (rope positions)"), err
    assert "RoPE lost 14% at 4x" in err and "Pass --max-new-tokens 124 or less" in err
