"""`attnkit bench decode --parts lm_vs_bare` runs end to end on a tiny model and records the ratios against the bare
torch loop (never asserted as speed) with the same greedy tokens; an unknown part is refused."""

import json

from attnkit.bench.decode import BareCompiledGreedy, bare_torch_greedy, gpt2_decoder
from attnkit.cli.main import main


def test_lm_vs_bare_runs_and_records_same_tokens(tmp_path):
    assert main(["bench", "decode", "--parts", "lm_vs_bare", "--dim", "32", "--layers", "1", "--heads", "2",
                 "--vocab", "64", "--repeats", "1", "--no-compile", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "decode_lm_vs_bare.json").read_text())
    assert set(record["contenders"]) == {"bare_loop", "attnkit_dynamic", "attnkit_static"}
    assert all(r["same_tokens_as_bare_loop"] for r in record["contenders"].values())
    assert set(record["speed_ratios"]) == {"TransformerLM eager (dynamic) vs bare loop",
                                           "TransformerLM eager (static) vs bare loop"}
    assert not (tmp_path / "decode.json").exists()  # the hf part did not run


def test_bare_static_layout_loop_gives_the_bare_loop_tokens():
    """The compiled baseline's step (static layout, tensor write slot, mask on positions), run eager here."""
    import torch

    torch.manual_seed(0)
    model = gpt2_decoder(vocab=64, dim=32, layers=2, heads=2)
    prompt = torch.randint(0, 64, (2, 5))
    loop = BareCompiledGreedy(model, 2, 5 + 6)
    loop.step = loop.forward  # eager: the same function torch.compile would trace
    assert torch.equal(loop(prompt, 6), bare_torch_greedy(model, prompt, 6))


def test_unknown_part_is_refused(tmp_path, capsys):
    assert main(["bench", "decode", "--parts", "hf,nope", "--out", str(tmp_path)]) != 0
    assert "--parts 'hf,nope': choose from hf, lm_vs_bare (comma-separated), got unknown ['nope']" in \
        capsys.readouterr().err
