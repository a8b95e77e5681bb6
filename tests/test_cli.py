import pytest

from attnkit.cli.main import main
from attnkit.cli.masks import parse
from attnkit.errors import AttnkitValueError


def test_masks_command_draws_expressions(capsys):
    assert main(["masks", "causal() & sliding_window(2)", "--size", "3"]) == 0
    out = capsys.readouterr().out
    assert "(causal() & sliding_window(2))\n# . .\n# # .\n. # #" in out


def test_masks_command_draws_every_documented_kind(capsys):
    """chunked(C) and two-sided windows are mask kinds the README documents: the command draws them."""
    assert main(["masks", "chunked(2) & causal()", "sliding_window(1, 1)", "--size", "4"]) == 0
    out = capsys.readouterr().out
    assert "# . . .\n# # . .\n. . # .\n. . # #" in out  # chunks of 2
    assert "# # . .\n# # # .\n. # # #\n. . # #" in out  # one key each side


def test_masks_gallery(capsys):
    assert main(["masks"]) == 0
    assert "document(doc_ids(1, 8))" in capsys.readouterr().out


@pytest.mark.parametrize(("expr", "match"), [("causal(", "is not valid"), ("__import__('os')", "only"),
                                             ("causal() + causal()", "only")])
def test_mask_expression_errors(expr, match):
    with pytest.raises(AttnkitValueError, match=match):
        parse(expr)


@pytest.mark.parametrize("name", ["tour", "demo"])  # `demo` is the tour's old name, kept as an alias
def test_tour_runs_and_explains(capsys, name):
    assert main([name, "--length", "10"]) == 0
    out = capsys.readouterr().out
    assert "backend: sdpa - is_causal=True" in out
    assert "backend: math" in out and "SDPA has no logit softcap" in out
    errors = [float(line.rsplit("=", 1)[1]) for line in out.splitlines() if line.startswith("max |out")]
    assert len(errors) == 8 and max(errors) < 1e-5


# ------------------------------------------------------------------------------ discovery and user errors

def test_version(capsys):
    import attnkit

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"attnkit {attnkit.__version__}\n"


@pytest.mark.parametrize(("argv", "first_line", "help_cmd"), [
    (["train", "--nope"], "attnkit train: error: unrecognized arguments: --nope", "attnkit train --help"),
    (["tour", "--length", "x"], "attnkit tour: error: argument --length: invalid int value: 'x'", "attnkit tour --help"),
    (["demo", "--length", "x"], "attnkit tour: error: argument --length: invalid int value: 'x'", "attnkit tour --help"),
    (["no-such-command"], "attnkit: error: argument command: invalid choice: 'no-such-command'", "attnkit --help"),
    ([], "attnkit: error: the following arguments are required: command", "attnkit --help"),
])
def test_argparse_errors_are_one_line_and_a_pointer_to_help(capsys, argv, first_line, help_cmd):
    """Issue 23: an argparse mistake printed the 20-line usage block before the line that matters."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(err) == 2, err
    assert err[0].startswith(first_line) and err[1] == f"see `{help_cmd}` for the options"

def test_a_new_command_is_a_new_file(tmp_path, monkeypatch, capsys):
    """Any ``attnkit.cli`` module with ``add_parser`` is a command: no list to edit (issue 16: hard-coded list)."""
    import sys

    import attnkit.cli

    (tmp_path / "hello_world.py").write_text(
        "def add_parser(sub):\n"
        "    p = sub.add_parser('hello-world')\n"
        "    p.set_defaults(run=lambda args: print('hi from a plug-in') or 0)\n")
    (tmp_path / "helpers_only.py").write_text("X = 1\n")  # no add_parser: not a command
    monkeypatch.setattr(attnkit.cli, "__path__", [*attnkit.cli.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "attnkit.cli.hello_world", raising=False)
    try:
        from attnkit.cli.main import command_modules

        found = command_modules()
        assert "hello-world" in found and "helpers-only" not in found
        assert {"train", "generate", "doctor", "masks", "tour", "bench"} <= set(found)
        assert main(["hello-world"]) == 0
        assert "hi from a plug-in" in capsys.readouterr().out
    finally:
        sys.modules.pop("attnkit.cli.hello_world", None)
        sys.modules.pop("attnkit.cli.helpers_only", None)


def test_user_error_prints_the_message_alone_and_exits_2(capsys):
    assert main(["doctor", "no-such-target"]) == 2
    err = capsys.readouterr().err
    assert "attnkit doctor: error: target 'no-such-target' is not a preset" in err
    assert "check the spelling or the path" in err
    assert "--debug" not in err and "Traceback" not in err and len(err.splitlines()) == 1  # one line, no hint


def test_debug_shows_the_traceback():
    with pytest.raises(AttnkitValueError, match="is not a preset"):
        main(["doctor", "no-such-target", "--debug"])
