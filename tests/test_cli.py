import pytest

from attnkit.cli.main import main
from attnkit.cli.masks import parse
from attnkit.errors import AttnkitValueError


def test_masks_command_draws_expressions(capsys):
    assert main(["masks", "causal() & sliding_window(2)", "--size", "3"]) == 0
    out = capsys.readouterr().out
    assert "(causal() & sliding_window(2))\n# . .\n# # .\n. # #" in out


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
