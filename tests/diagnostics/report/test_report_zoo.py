"""issue 29 item 2: `report` (with --compare, --heads) and `heads` on transformers families through the attention
interface, from a saved folder without a tokenizer (--ids), and capture / ablate / patch / head_importance on the
in-memory models; the report says what each layer is (full, sliding, chunked, local, linear layers skipped),
learned sink mass, GQA groups and MLA head sizes. A fast subset of the shared zoo (every family:
benchmarks/report_zoo.py)."""

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from attnkit._tolerance import within_rule  # noqa: E402
from attnkit.cli.main import main  # noqa: E402
from attnkit.diagnostics import capture  # noqa: E402
from attnkit.diagnostics.ablation import ablate, patch, record_heads  # noqa: E402
from attnkit.diagnostics.importance import head_importance  # noqa: E402
from attnkit.diagnostics.report import report  # noqa: E402
from attnkit.integrations.hf import zoo  # noqa: E402

IDS = "5 9 12 30 5 9 12 30 7"  # 9 tokens: longer than the zoo's window / chunk of 4, so those layers really cut

#: family -> the kinds its layers must report, in order (linear layers listed as skipped)
KINDS = {
    "llama": ["full (causal)", "full (causal)"],
    "gpt_oss": ["sliding 4", "full (causal)"],
    "deepseek_v3": ["full (causal)", "full (causal)"],
    "qwen3_next": ["full (causal)", "full (causal)", "skipped", "skipped"],
    "llama4": ["chunked 4", "chunked 4", "chunked 4", "full (causal)"],
    "modernbert": ["full (bidirectional)", "local (2, 2)", "local (2, 2)"],
    "falcon": ["full (causal)", "full (causal)"],
}


def _layers_table(page: str) -> list[list[str]]:
    body = re.search(r'<table id="layers">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family saved as `save_pretrained` writes it (no tokenizer), and a second seed for --compare."""
    root = tmp_path_factory.mktemp("zoo")
    for name in KINDS:
        zoo.build(name).save_pretrained(root / name)
    zoo.build("llama", seed=1).save_pretrained(root / "llama_b")
    return root


@pytest.mark.parametrize("name", list(KINDS))
def test_report_and_heads_from_a_folder_with_ids(name, folders, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(folders / name), "--ids", "--text", IDS, "--no-doctor", "--heads", "zero",
                 "--out", str(out)]) == 0
    page = out.read_text()
    rows = _layers_table(page)
    assert [r[2] for r in rows] == KINDS[name]
    assert 'id="importance-section"' in page
    capsys.readouterr()
    assert main(["heads", str(folders / name), "--ids", "--text", IDS, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    n_attention = sum(k != "skipped" for k in KINDS[name])
    assert len(result["scores"]) == n_attention


def test_report_compare_on_a_folder(folders, tmp_path):
    out = tmp_path / "c.html"
    assert main(["report", str(folders / "llama"), "--compare", str(folders / "llama_b"), "--ids", "--text", IDS,
                 "--no-doctor", "--out", str(out)]) == 0
    assert 'id="compare-section"' in out.read_text()


def test_a_folder_without_tokenizer_is_told_about_ids(folders, capsys):
    assert main(["heads", str(folders / "llama")]) == 2
    assert "--ids --text" in capsys.readouterr().err
    assert main(["report", str(folders / "llama"), "--ids", "--no-doctor"]) == 2
    assert "--ids reads --text as token ids" in capsys.readouterr().err
    assert main(["heads", str(folders / "llama"), "--ids", "--text", "5 999"]) == 2
    assert "outside the model's vocabulary [0, 96)" in capsys.readouterr().err
    assert main(["heads", str(folders / "llama"), "--ids", "--text", "five"]) == 2
    assert "is not token ids" in capsys.readouterr().err


def test_the_layers_table_states_gqa_mla_and_learned_sinks():
    ids = torch.tensor([[int(t) for t in IDS.split()]])
    rows = {n: _layers_table(str(report(zoo.build(n), ids, out=None, doctor=False))) for n in
            ("llama", "falcon", "deepseek_v3", "gpt_oss", "qwen3_next")}
    assert rows["llama"][0][3] == "4 query, 2 KV: 2 groups of 2"
    assert rows["falcon"][0][3] == "4 query, 1 KV: multi-query (all share one)"
    assert rows["deepseek_v3"][0][4] == "q/k 12, v 6 (MLA)"
    assert rows["gpt_oss"][0][6].startswith("learned: ") and rows["llama"][0][6] == ""
    assert rows["qwen3_next"][2][1] == "layer 0" and "linear attention" in rows["qwen3_next"][2][3]
    assert [r[1] for r in rows["qwen3_next"][:2]] == ["layer 1", "layer 3"]  # the attention layers' own indices


def _float64_eager(name: str):
    """zoo.build(name)'s weights (the same seed, then from_config) in float64 on eager attention and eager experts
    (transformers' grouped-matmul experts refuse float64)."""
    import transformers

    auto = transformers.AutoModelForMaskedLM if zoo.FAMILIES[name].encoder else transformers.AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = auto.from_config(zoo.config(name), attn_implementation="eager", experts_implementation="eager")
    return model.eval().double()


def _eager_weights(model, ids):
    with torch.no_grad():
        return [a for a in model(input_ids=ids, output_attentions=True).attentions if a is not None]


@pytest.mark.parametrize("name", ["gpt_oss", "deepseek_v3", "qwen3_next", "modernbert", "llama4"])
def test_captured_weights_are_transformers_eager_weights(name):
    """The report's weights against transformers' own eager attention (output_attentions) under the tolerance rule
    (golden: eager in float64 on the same weights; yardstick: eager in float32): sinks (gpt-oss rows sum below 1),
    MLA, chunks, two-sided windows. Before capture applied sinks, gpt-oss's rows summed to 1."""
    ids = torch.tensor([[int(t) for t in IDS.split()]])
    model = zoo.build(name, attn_implementation="eager")
    ref_t = _eager_weights(model, ids)
    golden = _eager_weights(_float64_eager(name), ids)
    model.set_attn_implementation("attnkit")
    with torch.no_grad(), capture(model) as cap:
        model(input_ids=ids)
    got = [r.weights for r in cap.records]
    assert len(got) == len(golden)
    for i, (out, ref, gold) in enumerate(zip(got, ref_t, golden)):
        rule = within_rule(out, ref, gold, dtype=torch.float32)
        assert rule.ok, rule.describe(f"{name} layer {i} weights", torch.float32)
    if name == "gpt_oss":
        assert (got[0].sum(-1) < 1 - 1e-3).all()  # the sink took its share


@pytest.mark.parametrize("name", ["llama", "qwen3_next", "bert"])
def test_ablate_patch_and_importance_in_memory(name):
    ids = torch.tensor([[int(t) for t in IDS.split()]])
    model = zoo.build(name, attn_implementation="attnkit")
    layers = sum(k != "skipped" for k in KINDS.get(name, ["full"] * 2))
    heads = [(layer, h) for layer in range(layers) for h in range(4)]
    with torch.no_grad():
        intact = model(input_ids=ids).logits
        with record_heads(model) as rec:
            model(input_ids=ids)
        with patch(model, heads, rec):  # every head patched from the same input: nothing changes
            same = model(input_ids=ids).logits
        with ablate(model, [(layers - 1, 1)]):
            ablated = model(input_ids=ids).logits
    assert torch.equal(same, intact)
    assert not torch.equal(ablated, intact)
    result = head_importance(model, ids)
    assert tuple(result.scores.shape) == (layers, 4) and torch.isfinite(result.scores).all()


def test_zero_ablation_is_the_head_cut_out_of_o_proj():
    """Known truth on LLaMA: zeroing head h's output is zeroing o_proj's input columns of that head (judged by the
    tolerance rule against the cut model in float64, with the cut model in float32 as the yardstick)."""
    ids = torch.tensor([[int(t) for t in IDS.split()]])
    model = zoo.build("llama", attn_implementation="attnkit")
    with torch.no_grad(), ablate(model, [(1, 2)]):
        ablated = model(input_ids=ids).logits
    D = model.config.hidden_size // model.config.num_attention_heads

    def cut(m):
        with torch.no_grad():
            m.model.layers[1].self_attn.o_proj.weight[:, 2 * D:3 * D] = 0
            return m(input_ids=ids).logits

    ref_t, golden = cut(model), cut(_float64_eager("llama"))
    rule = within_rule(ablated, ref_t, golden, dtype=torch.float32)
    assert rule.ok and not torch.equal(ablated, model(input_ids=ids).logits * 0), rule.describe("ablated logits")


def test_qwen2_moe_unused_sliding_mask_of_window_0_runs_through_attnkit():
    """Qwen2-MoE builds a sliding mask from sliding_window=0 it never uses; attnkit's mask reader refused window 0,
    so every attnkit tool failed on the family. Its logits through attnkit are eager's (tolerance rule)."""
    ids = torch.tensor([[int(t) for t in IDS.split()]])
    model = zoo.build("qwen2_moe", attn_implementation="attnkit")
    with torch.no_grad():
        out = model(input_ids=ids).logits
        model.set_attn_implementation("eager")
        ref_t = model(input_ids=ids).logits
        golden = _float64_eager("qwen2_moe")(input_ids=ids).logits
    rule = within_rule(out, ref_t, golden, dtype=torch.float32)
    assert rule.ok, rule.describe("qwen2_moe logits", torch.float32)
