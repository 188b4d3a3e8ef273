"""benchmarks/published_megatron.py: the transcribed Table 1 of Narayanan et al. 2021 against the paper's own
parameter-count formula, the plans it implies, the exact scaling the fit relies on (checked with the predictor on a
small GPT), and docs/predict.md's table equal to what the script prints."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _script():
    path = ROOT / "benchmarks" / "published_megatron.py"
    spec = importlib.util.spec_from_file_location("published_megatron", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_1_as_transcribed_matches_the_papers_parameter_formula():
    """The paper's equation 2, P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), gives each row's parameter count from
    its hidden size and layers (to the table's 0.1 B); each plan fills its GPUs and divides its batch."""
    m = _script()
    assert len(m.TABLE_1) == 10 and m.FITTED <= len(m.TABLE_1) / 3
    for size, heads, hidden, layers, tp, pp, gpus, batch, tflops in m.TABLE_1:
        p = 12 * layers * hidden ** 2 * (1 + 13 / (12 * hidden) + (m.VOCAB + m.SEQ) / (12 * layers * hidden))
        assert round(p / 1e9, 1) == pytest.approx(size, abs=0.11), size
        assert hidden % heads == 0 and gpus % (tp * pp) == 0 and batch % (gpus // (tp * pp)) == 0
        assert 0 < tflops < 312  # below the A100's dense 16-bit peak
    # the paper's equation 3 written out for the 1T point: 96·B·s·l·h² (1 + s/6h + V/16lh)
    b, l, h, s, v = 3072, 128, 25600, 2048, 51200
    assert m.paper_flops(b, l, h) == pytest.approx(96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)))


def test_every_rate_times_eta_divides_the_step_by_eta():
    """The fit's premise, with the predictor itself: on a datasheet profile (no latency, no overhead) a small
    GPT-2 under tp=2, pp=2, dp=2 with 4 microbatches predicts a step 1/η as long when every rate is η times."""
    pytest.importorskip("transformers")
    import transformers

    import flopcount
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.predict import predict_work, work_of

    m = _script()
    config = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=256,
                                     dtype="bfloat16")
    report = flopcount.from_hf(config, (1, 64), cache_dir=False, mode="train", optimizer="adam", recompute="full",
                               parallel="tp=2,pp=2,dp=2", microbatches=4)
    import dataclasses

    # nodes of 2 GPUs, so that the data-parallel and pipeline groups cross nodes and the network's cap is scaled too
    a100 = device_profile("A100", 8)
    base = dataclasses.replace(a100, network=dataclasses.replace(a100.network, devices=2))
    work = work_of(report)
    step = predict_work(work, base).step_seconds
    assert step > predict_work(work, dataclasses.replace(base, network=None)).step_seconds  # the cap binds
    for eta in (0.5, 0.37):
        slow = m.scaled(base, eta)
        assert slow.peak_flops_per_s == base.peak_flops_per_s
        assert predict_work(work, slow).step_seconds == pytest.approx(step / eta, rel=1e-12)
    assert base.compute["gemm"][0].best == 312e12  # the datasheet profile itself untouched


@pytest.mark.slow
def test_the_docs_table_is_the_scripts_output():
    """Counts ten GPT models up to 1T parameters under their plans (minutes; the exports are cached after)."""
    pytest.importorskip("transformers")
    m = _script()
    printed = m.table(m.rows())
    docs = (ROOT / "docs" / "predict.md").read_text(encoding="utf-8")
    held = re.search(r"<!-- published_megatron.py: begin -->\n(.*?)<!-- published_megatron.py: end -->", docs, re.S)
    assert held is not None and held.group(1) == printed
