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


def test_demo_runs_and_explains(capsys):
    assert main(["demo", "--length", "10"]) == 0
    out = capsys.readouterr().out
    assert "backend: sdpa - is_causal=True" in out
    assert "backend: math" in out and "SDPA has no logit softcap" in out
    errors = [float(line.rsplit("=", 1)[1]) for line in out.splitlines() if line.startswith("max |out")]
    assert len(errors) == 8 and max(errors) < 1e-5


# ------------------------------------------------------------------------------ discovery and user errors

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
        assert {"train", "generate", "doctor", "masks", "demo", "bench"} <= set(found)
        assert main(["hello-world"]) == 0
        assert "hi from a plug-in" in capsys.readouterr().out
    finally:
        sys.modules.pop("attnkit.cli.hello_world", None)
        sys.modules.pop("attnkit.cli.helpers_only", None)


def test_user_error_prints_the_message_alone_and_exits_2(capsys):
    assert main(["doctor", "no-such-target"]) == 2
    err = capsys.readouterr().err
    assert "attnkit doctor: error: target 'no-such-target' is not a preset" in err
    assert "check the spelling or the path" in err and "--debug" in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback():
    with pytest.raises(AttnkitValueError, match="is not a preset"):
        main(["doctor", "no-such-target", "--debug"])
