"""The labs: every lab runs at --quick size and writes sane outputs; claims judge by their parts only."""

import json
import math

import pytest
import torch

from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError
from attnkit.labs import LABS, get_lab, lab
from attnkit.labs.harness import IGNORE, copy_batch, recall_batch
from attnkit.labs.report import FAILS, HOLDS, MIXED, Claim, check_out_folder

VERDICTS = {HOLDS, FAILS, MIXED, "not measured"}
EXPECTED = {"scale", "mask", "positions", "long-range", "heads", "efficient", "pitfalls", "procedure"}


def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, float):
        yield value


def test_registry_has_every_lab():
    assert set(LABS) >= EXPECTED


def test_every_lab_runs_quick_and_writes_sane_outputs(tmp_path):
    """One test (not one per lab) so that parallel workers don't each run every lab."""
    assert main(["lab", "all", "--quick", "--out", str(tmp_path)]) == 0
    for name in sorted(EXPECTED):
        check_outputs(tmp_path / name, name)


def check_outputs(folder, name):
    payload = json.loads((folder / "results.json").read_text())
    assert payload["lab"] == name and payload["size"] == "quick"
    assert len(payload["verdicts"]) == len(get_lab(name).claims) >= 3
    for v in payload["verdicts"]:
        assert v["verdict"] in VERDICTS, (name, v)
        assert v["measured"] and v["band"] and v["claim"], (name, v)
    # quick runs must actually measure: at most one claim may lack its measurement (a task too short to be learned
    # at the quick size is a stated precondition, not a missing measurement)
    unlearned = [v for v in payload["verdicts"] if "no model learned" in v["measured"] or "did not learn" in v["measured"]
                 or "speed not measured at this size" in v["measured"]]
    assert all(v["verdict"] == "not measured" for v in unlearned), (name, unlearned)
    assert sum(v["verdict"] == "not measured" for v in payload["verdicts"]) - len(unlearned) <= 1, (name, payload)
    numbers = list(_numbers(payload["measurements"]))
    assert numbers and sum(math.isfinite(x) for x in numbers) >= 0.5 * len(numbers), name
    summary = (folder / "summary.md").read_text()
    assert "| claim | pass band" in summary, name
    for v in payload["verdicts"]:
        assert f"**{v['verdict']}**" in summary, (name, v)
    assert payload["figures"], name
    for fig in payload["figures"]:
        png = (folder / fig).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and 2_000 < len(png) < 300_000, (name, fig, len(png))


def test_verdict_follows_the_parts():
    def claim(parts):
        return Claim("c", "b", lambda m: ("x", parts)).verdict({})["verdict"]

    assert claim([True, True]) == HOLDS
    assert claim([True, False]) == MIXED
    assert claim([False]) == FAILS
    assert claim([]) == "not measured"  # a band with nothing in scope is not a pass
    missing = Claim("c", "b", lambda m: (m["absent"], [True])).verdict({})
    assert missing["verdict"] == "not measured" and "absent" in missing["measured"]


def test_unknown_lab_is_a_typed_error(capsys):
    with pytest.raises(AttnkitValueError, match="unknown lab 'nope'; choose one of"):
        get_lab("nope")
    assert main(["lab", "nope", "--quick"]) == 2
    assert "unknown lab 'nope'" in capsys.readouterr().err


def test_a_lab_needs_both_sizes():
    with pytest.raises(AttnkitValueError, match="sizes must be exactly 'default' and 'quick'"):
        lab("x", "x", sizes={"quick": {}}, claims=[])


def test_list(capsys):
    assert main(["lab", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPECTED)


def test_recall_task_answers_sit_gap_back_after_their_key():
    g = torch.Generator().manual_seed(0)
    tokens, targets, gaps = recall_batch(g, 16, 64, 256, 4)
    for b in range(16):
        queries = (targets[b] != IGNORE).nonzero().flatten().tolist()
        assert len(queries) == 4 and all(q >= 32 for q in queries)
        for q in queries:
            value_pos = q - int(gaps[b, q])
            assert tokens[b, value_pos] == targets[b, q] >= 128  # values from the upper half
            assert tokens[b, value_pos - 1] == tokens[b, q] < 128  # the key before it is the query
            assert (tokens[b, :32] == tokens[b, q]).sum() == 1  # each key appears once among the pairs


def test_copy_task_targets_are_the_first_half():
    g = torch.Generator().manual_seed(0)
    tokens, targets = copy_batch(g, 4, 5, 50, length=13)
    assert torch.equal(targets[:, 5:10], tokens[:, :5]) and torch.equal(tokens[:, 6:11], tokens[:, :5])
    assert (targets[:, :5] == IGNORE).all() and (targets[:, 10:] == IGNORE).all()


def test_claims_on_a_task_no_model_learned_are_not_measured():
    """A comparison of architectures on a task nobody learned is no evidence: 'not measured', never 'holds'."""
    from attnkit.labs.long_range import CLAIMS, LEARNED_FLOOR

    def task(acc):
        return {model: {"params": 1, "accuracy": dict(acc)} for model in ("attention", "lstm", "cnn")}

    at_chance = {"recall": task({"1-8": 0.01, "17-32": 0.0}), "copy": task({"4": 0.01, "16": 0.0})}
    assert all(c.verdict(at_chance)["verdict"] == "not measured" for c in CLAIMS)
    learned = {"recall": task({"1-8": LEARNED_FLOOR, "17-32": 0.0}), "copy": task({"4": 1.0, "16": 1.0})}
    assert all(c.verdict(learned)["verdict"] != "not measured" for c in CLAIMS)


def test_claims_on_a_model_that_learned_nothing_are_not_measured():
    """The regression: at --quick size the labs printed "holds" for models still at chance (loss ~ ln 257)."""
    import math

    from attnkit.labs.efficient import CLAIMS as EFFICIENT
    from attnkit.labs.harness import VOCAB, learned

    chance = math.log(VOCAB)
    quality = lambda full: {"quality": {k: {"val_loss": full} for k in ("full", "window", "strided", "linear")}}  # noqa: E731
    for claim in EFFICIENT[:2]:  # the quality claims
        at_chance = claim.verdict(quality(chance - 0.01))
        assert at_chance["verdict"] == "not measured" and "full attention did not learn" in at_chance["measured"]
        assert claim.verdict(quality(2.0))["verdict"] != "not measured"
    assert learned(2.0, "x") == 2.0
    with pytest.raises(ValueError, match=r"the model did not learn: loss 5.5 >= 0.9 x ln\(257\) = 4.99"):
        learned(5.5, "the model")


def test_speed_claims_are_not_measured_below_the_size_that_times_the_work():
    """Issue 23: `lab all --quick` said "does not hold" for speed claims it timed at lengths 64-128 (overhead)."""
    from attnkit.labs import efficient, heads

    speed = [c for c in efficient.CLAIMS if "faster" in c.claim or "overtakes" in c.claim]
    assert len(speed) == 2

    def timings(lengths, window_share):
        return {"times": {str(L): {"full": 1.0, "window": window_share, "strided": 1.0, "linear": 2.0}
                          for L in lengths}, "crossover": {"linear": None, "window": lengths[0]}}

    for claim in speed:
        quick = claim.verdict(timings([64, 128], 0.5))
        assert quick["verdict"] == "not measured", quick
        assert quick["measured"] == ("not measured (speed not measured at this size: the longest timed length 128 < "
                                     "1024; run the default size (not the quick one))")
        assert claim.verdict(timings([256, 4096], 1.0))["verdict"] == FAILS  # judged, and can fail, at full size
    assert speed[1].verdict(timings([256, 4096], 0.5))["verdict"] == HOLDS
    step = next(c for c in heads.CLAIMS if "time" in c.claim)
    runs = {"1": {"step_ms": 1.0}, "4": {"step_ms": 2.0}}
    narrow = step.verdict({"heads": [1, 4], "width": 16, "runs": runs})
    assert narrow["verdict"] == "not measured" and "the model width 16 < 64" in narrow["measured"]
    assert step.verdict({"heads": [1, 4], "width": 64, "runs": runs})["verdict"] == FAILS


def test_every_lab_module_is_discovered_without_a_list():
    """Adding a lab is adding a file: every module of attnkit.labs with an @lab(...) is registered."""
    import re
    from pathlib import Path

    import attnkit.labs as labs

    declared = {m.group(1) for path in Path(labs.__file__).parent.glob("*.py")
                for m in re.finditer(r'^@lab\(\s*"([^"]+)"', path.read_text(), flags=re.M)}
    assert declared and declared == set(labs.LABS), (declared, set(labs.LABS))
    assert "import (" not in Path(labs.__file__).read_text()  # no hand-kept import list


def test_out_is_never_a_users_folder(tmp_path, capsys):
    """`attnkit lab NAME --out DIR` refuses a non-empty folder that is not that lab's earlier output (run-folder
    rules), before anything runs, and deletes nothing."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert main(["lab", "heads", "--quick", "--out", str(mine)]) == 2
    assert (f"--out {str(mine)!r} is not empty and is not an earlier output of lab 'heads': it holds ['thesis.tex'], "
            "which a lab does not write; pick an empty or new --out, or pass --overwrite") in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"lab": "scale"}))
    with pytest.raises(AttnkitValueError, match="its results.json is not lab 'heads''s \\(lab: 'scale'\\)"):
        check_out_folder(other, "heads")
    (other / "results.json").write_text("{")
    with pytest.raises(AttnkitValueError, match="its results.json can't be read as JSON \\(JSONDecodeError"):
        check_out_folder(other, "heads")
    (other / "results.json").write_text(json.dumps({"lab": "heads"}))
    (other / "attn.png").write_bytes(b"")
    assert check_out_folder(other, "heads") == other  # an earlier output of the same lab
    assert check_out_folder(mine, "heads", overwrite=True) == mine
    (tmp_path / "file").write_text("x")
    with pytest.raises(AttnkitValueError, match="^out='.*file' is a file; pass a folder"):
        check_out_folder(tmp_path / "file", "heads")


def test_the_scale_labs_training_claims_need_a_model_that_learned():
    """Issue 31 item 5: `lab scale --quick` rated "the unscaled model's attention turns more one-hot during training"
    "does not hold" from a pair of models that never learned (the claim above it said "not measured")."""
    import math

    from attnkit.labs.harness import VOCAB
    from attnkit.labs.scale import CLAIMS

    training = [c for c in CLAIMS if "train" in c.claim.lower() and "at init" not in c.claim]
    assert len(training) == 2

    def runs(final_loss, unscaled_share):
        run = lambda share, loss: {"final_loss": loss, "one_hot_share": [0.0, share]}  # noqa: E731
        return {"train": {"scaled": run(0.0, final_loss), "unscaled": run(unscaled_share, 1.2 * final_loss)}}

    for claim in training:
        at_chance = claim.verdict(runs(math.log(VOCAB) - 0.1, 0.5))
        assert at_chance["verdict"] == "not measured" and "the scaled model did not learn" in at_chance["measured"]
        assert claim.verdict(runs(2.0, 0.5))["verdict"] == "holds"
        assert claim.verdict(runs(2.0, 0.0))["verdict"] != "not measured"
