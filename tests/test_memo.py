"""The one bounded memo (attnkit._memo): every cross-call table is a Memo, bounded, cleared when full."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

import attnkit
import attnkit as ak
from attnkit import _memo, _validation
from attnkit.backends import lane, registry
from attnkit.masks import prepared

SRC = Path(attnkit.__file__).parent


def test_every_cross_call_table_is_a_memo():
    tables = {"checked tensors": _validation._CHECKED_TENSORS, "plain lanes": lane._LANES,
              "auto choices": registry._CHOICES, "shared causal forms": prepared._SHARED}
    for name, table in tables.items():
        assert type(table) is _memo.Memo and table.name == name
        assert _memo.memos()[name] is table
    pm = ak.masks.prepare(ak.masks.sliding_window(4), 8)
    assert type(pm.lanes) is _memo.Memo


def test_a_full_memo_clears_before_storing_and_get_or_build_builds_once():
    m = _memo.Memo("test memo", 3, register=False)
    built = []
    for key in "abc":
        m.get_or_build(key, lambda key=key: built.append(key) or key.upper())
    assert m.get_or_build("a", lambda: "again") == "A" and built == ["a", "b", "c"]
    m["d"] = "D"  # full: cleared first
    assert dict(m) == {"d": "D"}
    m["d"] = "E"  # an existing key is replaced, nothing cleared
    m.update(e=1, f=2)
    m.setdefault("g", 3)
    assert len(m) <= 3 and m["g"] == 3
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        _memo.Memo("bad", 0)


def test_the_bound_holds_through_the_plain_lane():
    lane._LANES.clear()
    for L in range(1, lane._LANES.max_entries + 5):
        q = torch.randn(1, 1, L, 4)
        ak.attention(q, q, q)
    assert 0 < len(lane._LANES) <= lane._LANES.max_entries


def test_no_module_keeps_a_table_cleared_by_hand():
    """The clear-when-full pattern (``if len(T) >= MAX: T.clear()``) lives in _memo.py only."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "_memo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                    isinstance(node.test.left, ast.Call) and getattr(node.test.left.func, "id", None) == "len" and \
                    any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "clear"
                        for stmt in node.body for n in ast.walk(stmt)):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == [], f"use attnkit._memo.Memo instead of a table cleared by hand: {offenders}"


def test_attention_call_is_built_by_keyword_only():
    q = torch.randn(1, 2, 3, 4)
    call = _validation.build_call(q, q, q)
    values = [getattr(call, f.name) for f in dataclasses.fields(call)]
    with pytest.raises(TypeError):
        _validation.AttentionCall(*values)
    assert all(f.kw_only for f in dataclasses.fields(_validation.AttentionCall))
    rebuilt = _validation.AttentionCall(**{f.name: getattr(call, f.name) for f in dataclasses.fields(call)})
    assert rebuilt.signature() == call.signature()
