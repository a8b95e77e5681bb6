"""issue 29 item 3: the head detectors' patterns and scores (TransformerLens' detect_head, error_measure='mul'),
on hand-made attention with known scores, on models, in the report and in `attnkit heads`. The agreement with
TransformerLens itself: test_detectors_lens.py."""

import json
import math

import pytest
import torch

from attnkit.cli.main import main
from attnkit.diagnostics.detectors import (
    detect_heads,
    duplicate_token_pattern,
    head_scores,
    induction_pattern,
    previous_token_pattern,
    top_heads,
)
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import build_lm

TOKENS = torch.tensor([7, 3, 9, 7, 3, 9])


def _rows(pattern: torch.Tensor) -> torch.Tensor:
    """An attention matrix that is ``pattern`` row-normalised, rows without a 1 attending to themselves."""
    a = pattern.clone()
    empty = a.sum(-1) == 0
    a[empty, empty.nonzero().squeeze(-1)] = 1
    return a / a.sum(-1, keepdim=True)


def test_patterns_are_the_ones_interpretability_users_know():
    prev = previous_token_pattern(TOKENS)
    assert prev.tolist()[3] == [0, 0, 1, 0, 0, 0] and prev[0].sum() == 0
    dup = duplicate_token_pattern(TOKENS)  # position 3 (token 7) has an earlier copy at 0
    assert dup.nonzero().tolist() == [[3, 0], [4, 1], [5, 2]]
    ind = induction_pattern(TOKENS)  # ... and the token after that copy, at 1
    assert ind.nonzero().tolist() == [[3, 1], [4, 2], [5, 3]]
    assert duplicate_token_pattern(torch.arange(5)).sum() == 0  # no repeat: nothing to find


def test_scores_of_perfect_and_absent_heads():
    L = len(TOKENS)
    perfect_prev = _rows(previous_token_pattern(TOKENS))  # row 0 attends to itself (it has no previous token)
    ind = _rows(induction_pattern(TOKENS))
    weights = torch.stack([perfect_prev, ind, torch.eye(L)])  # (3, L, L)
    prev = head_scores(weights, previous_token_pattern(TOKENS))
    assert prev == pytest.approx([(L - 1) / L, 0.0, 0.0])  # mass on (i, i-1) over all L rows' mass
    # the induction head: rows 3..5 on the token after the earlier copy (half the rows), rows 0..2 on themselves
    assert head_scores(weights, induction_pattern(TOKENS)) == pytest.approx([0.0, 3 / L, 0.0])
    # excluding the current token leaves the previous-token head perfect (row 0 had only itself)
    assert head_scores(weights[:1], previous_token_pattern(TOKENS), exclude_current_token=True) == [pytest.approx(1.0)]
    assert math.isnan(head_scores(torch.eye(L)[None], previous_token_pattern(TOKENS), exclude_current_token=True)[0])
    with pytest.raises(AttnkitValueError, match="square weights"):
        head_scores(torch.ones(1, 2, 3), previous_token_pattern(TOKENS))


def test_detect_heads_scores_the_weights_capture_records():
    """detect_heads on a model = the scores of the weights ak.diagnostics.capture records on the same tokens."""
    from attnkit.diagnostics import capture

    torch.manual_seed(0)
    model = build_lm("nano").eval()
    ids = torch.tensor([[5, 9, 12, 30, 5, 9, 12, 30, 7]])
    scores = detect_heads(model, ids)
    assert set(scores) == {"previous_token", "duplicate_token", "induction"}
    with torch.no_grad(), capture(model) as cap:
        model(ids)
    for l, record in enumerate(cap.records):
        for name, pattern in (("previous_token", previous_token_pattern), ("induction", induction_pattern)):
            expected = head_scores(record.weights[0], pattern(ids[0]))
            assert scores[name][l].tolist() == pytest.approx(expected, abs=1e-12)
    assert top_heads(torch.tensor([[0.1, float("nan")], [0.7, 0.2]], dtype=torch.float64), 2) == [((1, 0), 0.7), ((1, 1), 0.2)]
    with pytest.raises(AttnkitValueError, match="at least 2 token ids"):
        detect_heads(model, [5])


def test_the_report_and_heads_show_the_detectors(tmp_path, capsys):
    from attnkit.diagnostics.report import report

    torch.manual_seed(0)
    page = str(report(build_lm("nano").eval(), "abcabcabc", out=None, doctor=False))
    assert 'id="detectors"' in page and "prev-token head" in page and "induction head" in page
    assert main(["heads", "nano", "--text", "abcabcabc", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["detectors"]) == {"previous_token", "duplicate_token", "induction"}
    assert len(out["detectors"]["induction"]) == 2
    assert main(["heads", "nano", "--text", "abcabcabc"]) == 0
    assert "induction" in capsys.readouterr().out
