"""The labs: every lab runs at --quick size and writes sane outputs; claims judge by their parts only."""

import json
import math

import pytest

from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError
from attnkit.labs import LABS, get_lab, lab
from attnkit.labs.report import FAILS, HOLDS, MIXED, Claim

VERDICTS = {HOLDS, FAILS, MIXED, "not measured"}
EXPECTED = {"scale", "mask", "positions", "long-range", "heads", "efficient", "pitfalls"}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("labs")
    assert main(["lab", "all", "--quick", "--out", str(out)]) == 0
    return out


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


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_writes_sane_outputs(quick_runs, name):
    folder = quick_runs / name
    payload = json.loads((folder / "results.json").read_text())
    assert payload["lab"] == name and payload["size"] == "quick"
    assert len(payload["verdicts"]) == len(get_lab(name).claims) >= 3
    for v in payload["verdicts"]:
        assert v["verdict"] in VERDICTS, v
        assert v["measured"] and v["band"] and v["claim"]
        assert v["verdict"] != "not measured" or v["measured"].startswith("not measured") or not v["parts"], v
    # quick runs must actually measure: at most one claim may lack its measurement
    assert sum(v["verdict"] == "not measured" for v in payload["verdicts"]) <= 1, payload["verdicts"]
    numbers = list(_numbers(payload["measurements"]))
    assert numbers and sum(math.isfinite(x) for x in numbers) >= 0.5 * len(numbers)
    summary = (folder / "summary.md").read_text()
    assert "| claim | pass band" in summary
    for v in payload["verdicts"]:
        assert f"**{v['verdict']}**" in summary
    assert payload["figures"]
    for fig in payload["figures"]:
        png = (folder / fig).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and 2_000 < len(png) < 300_000


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
