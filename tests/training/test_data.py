"""Data: byte tokenizer, corpora, deterministic split by file, packing with document ids and restarting
positions, deterministic batches, the unigram baseline."""

import math

import pytest
import torch

from attnkit.errors import AttnkitValueError
from attnkit.training.data import (
    ByteTokenizer,
    PackedDataset,
    load_documents,
    restart_positions,
    split_by_file,
    stdlib_files,
    unigram_loss,
)


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    text = "déf f(x):\n    return '✓' # ok"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids + [tok.EOS]) == text and tok.vocab_size == 257


def test_default_corpus_is_the_stdlib_without_tests():
    root, files = stdlib_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files)
    assert not any({"test", "tests", "site-packages"} & set(f.relative_to(root).parts) for f in files)


def test_split_is_by_file_deterministic_and_disjoint(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i}\n" * 20)
    docs = load_documents(tmp_path)
    train, val = split_by_file(docs, 0.2)
    names_t, names_v = {n for n, _ in train}, {n for n, _ in val}
    assert names_t.isdisjoint(names_v) and len(names_t | names_v) == 40 and names_v
    assert split_by_file(list(reversed(docs)), 0.2)[1] == sorted(val, key=lambda d: d[0], reverse=True)
    (tmp_path / "f40.txt").write_text("new file\n")  # adding a file does not move the others
    train2, val2 = split_by_file(load_documents(tmp_path), 0.2)
    assert names_v <= {n for n, _ in val2} and names_t <= {n for n, _ in train2}


def test_single_file_splits_by_bytes(tmp_path):
    path = tmp_path / "one.txt"
    path.write_bytes(b"x" * 100)
    train, val = split_by_file(load_documents(path), 0.1)
    assert len(train[0][1]) == 90 and len(val[0][1]) == 10


def test_packing_doc_ids_positions_and_targets():
    docs = [("a", b"abc"), ("b", b"defgh"), ("c", b"ij")]
    ds = PackedDataset(docs, seq_len=6)
    stream = list(b"abc") + [256] + list(b"defgh") + [256] + list(b"ij") + [256]  # 13 tokens -> 2 rows
    assert ds.num_rows == 2 and ds.tokens.tolist() == stream
    batch = ds.rows(torch.tensor([0, 1]))
    assert batch.inputs.tolist() == [stream[0:6], stream[6:12]]
    assert batch.targets.tolist() == [stream[1:7], stream[7:13]]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]]  # restart per doc and per row
    assert batch.doc_ids.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]]
    plain = PackedDataset(docs, seq_len=6, doc_mask=False).rows(torch.tensor([0]))
    assert plain.doc_ids is None and plain.positions is None and plain.inputs.tolist() == [stream[0:6]]


def test_restart_positions_matches_a_loop():
    doc = torch.randint(0, 3, (4, 30)).cummax(dim=1).values
    expected = [[j - next(i for i in range(j + 1) if row[i] == row[j]) for j in range(30)] for row in doc.tolist()]
    assert restart_positions(doc).tolist() == expected


def test_batches_are_a_function_of_seed_and_step_and_ranks_split_them():
    ds = PackedDataset([("a", bytes(torch.randint(0, 256, (1000,)).tolist()))], seq_len=8)
    a, b = ds.batch(3, 4, seed=1), ds.batch(3, 4, seed=1)
    assert torch.equal(a.inputs, b.inputs) and not torch.equal(a.inputs, ds.batch(3, 4, seed=2).inputs)
    halves = [ds.batch(3, 4, seed=1, rank=r, world=2).inputs for r in (0, 1)]
    assert torch.equal(torch.cat(halves), a.inputs)
    seen = [tuple(r) for i in range(ds.num_rows // 4) for r in ds.batch(i, 4, seed=0).inputs.tolist()]
    assert len(set(seen)) == len(seen) == ds.num_rows // 4 * 4  # an epoch visits each row once


def test_unigram_baseline_is_the_entropy_of_uniform_data():
    data = bytes(range(256)) * 40
    ds = PackedDataset([("a", data)], seq_len=64)
    loss = unigram_loss(ds, list(ds.eval_batches(4, 2)), 257)
    assert abs(loss - math.log(256)) < 0.01


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: load_documents(p / "missing"), "neither a file nor a folder"),
    (lambda p: load_documents(p), "has no text files"),
    (lambda p: split_by_file([("a", b"x")], 1.5), "val_fraction must be in"),
    (lambda p: PackedDataset([("a", b"abc")], seq_len=8), "fewer than one row"),
    (lambda p: PackedDataset([("a", b"abc")], seq_len=1), "seq_len must be >= 2"),
])
def test_errors(tmp_path, make, match):
    with pytest.raises(AttnkitValueError, match=match):
        make(tmp_path)
