"""The per-rank memory ledger walks once per (pipeline stage, EP load) and places that walk on every TP rank of
the stage, its peak the one walk's plus the bytes held throughout: its every figure, rank by rank, equals the
earlier per_rank's (one walk per TP rank, run twice; kept in tests/core/memory_ranks_before.py) on a tiny Llama
and a tiny Mixtral under plans that exercise TP, SP, PP (1F1B, GPipe, interleaved), CP, FSDP, EP and a skewed
expert load, with and without recompute."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.experts import ExpertLoad
from flopcount.parallel.plan import parse_parallel

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location("memory_ranks_before", Path(__file__).with_name("memory_ranks_before.py"))
before = sys.modules["memory_ranks_before"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(before)

H, L, HEADS, KV_HEADS, FFN, V = 32, 4, 4, 2, 48, 64
B, S = 2, 8


def _count(config, recompute="none"):
    import flopcount

    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", optimizer="adam",
                             memory=MemorySettings(device="cpu", recompute=recompute))


@pytest.fixture(scope="module", params=["selective", pytest.param("none", marks=pytest.mark.slow),
                                        pytest.param("full", marks=pytest.mark.slow)])
def llama(request):
    return _count(transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                           vocab_size=V), request.param)


@pytest.fixture(scope="module")
def mixtral():
    return _count(transformers.MixtralConfig(hidden_size=H, intermediate_size=24, num_hidden_layers=2,
                                             num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
                                             num_local_experts=4, num_experts_per_tok=2))


def _same(report, text, m=1, schedule="1f1b", load=None):
    plan = parse_parallel(text, microbatches=m, schedule=schedule)
    new, old = per_rank(report, plan, load), before.per_rank(report, plan, load)
    assert len(new.ranks) == len(old.ranks) > 0
    assert [r.as_dict() for r in new.ranks] == [r.as_dict() for r in old.ranks]
    assert new.settings == old.settings


@pytest.mark.parametrize("text,m,schedule", [
    ("tp=2", 1, "1f1b"), ("tp=4,sp", 1, "1f1b"), ("tp=2,pp=2,dp=2", 4, "1f1b"), ("pp=2,dp=2,fsdp", 4, "gpipe"),
    ("tp=2,pp=2", 4, "interleaved:2"), ("tp=2,pp=2,cp=2,dp=2", 8, "1f1b"), ("dp=4,fsdp", 1, "1f1b"),
    ("cp=2,dp=2,fsdp", 2, "1f1b"),
])
def test_llama_per_rank_unchanged(llama, text, m, schedule):
    _same(llama, text, m, schedule)


@pytest.mark.parametrize("text,m", [("ep=2,dp=2", 1), ("tp=2,ep=2,dp=2,fsdp", 2), ("ep=4,dp=2,cp=2", 1)])
def test_mixtral_per_rank_unchanged(mixtral, text, m):
    _same(mixtral, text, m)


def test_mixtral_skewed_load_unchanged(mixtral):
    _same(mixtral, "ep=2,dp=2", 2, load=ExpertLoad([[3, 1, 1, 1], [1, 1, 1, 3]], "test"))
