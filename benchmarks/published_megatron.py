"""The per-GPU throughput of the published Megatron-LM GPT runs predicted from the A100's datasheet.

The points: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC21, arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters (vocabulary 51,200, sequence
2048) trained on up to 3,072 A100 GPUs of NVIDIA's Selene with mixed precision, each with its tensor- and
pipeline-parallel sizes, GPU count, global batch and achieved teraFLOP/s per GPU, where the FLOPs of an iteration
are the paper's F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (activation recomputation included).

Each point is counted by flopcount (a GPT-2 of the point's hidden size, heads and layers built from its
configuration in bf16, one microbatch of 1 × 2048 tokens, the stack of layers counted from its 1- and 2-layer
exports and extended exactly) under the point's plan (tp, pp, dp = GPUs / (tp·pp), B / dp microbatches, the 1F1B
schedule, full recompute, Adam) and predicted on the ``--device A100`` profile (datasheet: 312 TFLOP/s bf16, 2,039
GB/s HBM, 300 GB/s NVLink bus inside a node of 8 GPUs and, for a group across nodes, each GPU's 200 Gb/s
HDR InfiniBand adapter (25 GB/s), as Selene's DGX A100 nodes had them; collective latency not known, no framework
overhead). Table 1 does not give the
microbatch size nor whether the interleaved schedule ran: 1 and 1F1B are taken for every point (stated, not
fitted). The predicted throughput is F / (predicted step × GPUs), the measured F / (measured step × GPUs), so the
error is that of the step time.

One efficiency parameter is fitted on the three smallest points (a third of the ten): η, the share of every
datasheet rate (products, memory, links) the runs reach. With no latency and no overhead in the profile, every
figure of the prediction is a rate, so the step on the profile with every rate × η is the datasheet's step / η
exactly (the script checks it on the fitted points with the predictor itself); η is the geometric mean of measured
/ datasheet throughput over the fitted points. The seven other points are then predicted on the η profile and their
errors printed beside Calculon's published 3.65% mean and 8.87% worst (Isaev et al. 2023, on the Megatron points it
was built against).

    PYTHONPATH=$PWD python3 benchmarks/published_megatron.py        # about ten minutes (counts cached after)

The table it prints is docs/predict.md's (tests/measure/predict/test_published_megatron.py checks that they agree).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence

# (parameters in billions, heads, hidden, layers, tp, pp, GPUs, global batch, achieved TFLOP/s per GPU): Table 1.
TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
VOCAB, SEQ, MICROBATCH = 51200, 2048, 1
FITTED = 3  # the three smallest points: at most a third of the ten
CALCULON = (0.0365, 0.0887)  # mean and worst |error|, Isaev et al. 2023


def paper_flops(batch: int, layers: int, hidden: int) -> float:
    """The paper's FLOPs of an iteration (its equation 3, activation recomputation included)."""
    return 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def scaled(profile, eta: float):
    """``profile`` with every rate (products, memory, collective bus bandwidth, the network's adapters) × ``eta``;
    its peak (what MFU divides by) unchanged."""
    from flopcount.measure.machine.calibration import Collective, Point, Segment

    def pts(points):
        return tuple(Point(p.size, p.median * eta, p.best * eta, p.slowest * eta) for p in points)

    def seg(s):
        return Segment(s.low, s.high, s.latency_s, {k: v * eta for k, v in s.bus_bytes_per_s.items()})

    network = profile.network and dataclasses.replace(profile.network, bytes_per_s=profile.network.bytes_per_s * eta)
    return dataclasses.replace(profile, compute={k: pts(v) for k, v in profile.compute.items()},
                               collectives={k: Collective(c.ranks, c.points, tuple(seg(s) for s in c.segments))
                                            for k, c in profile.collectives.items()}, network=network)


def work_of_point(row: Sequence[float]):
    """The predictor's plain numbers of one Table 1 point (counted by flopcount under its plan)."""
    import transformers

    import flopcount
    from flopcount.measure.predict import work_of

    _, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    dp = gpus // (tp * pp)
    config = transformers.GPT2Config(n_embd=hidden, n_head=heads, n_layer=layers, n_positions=SEQ, vocab_size=VOCAB,
                                     dtype="bfloat16")
    report = flopcount.from_hf(config, (MICROBATCH, SEQ), mode="train", optimizer="adam", recompute="full",
                               parallel=f"tp={tp},pp={pp},dp={dp}", microbatches=batch // (dp * MICROBATCH),
                               schedule="1f1b")
    return work_of(report)


def rows() -> list[dict]:
    """Every point: its plan, the published and the datasheet-predicted throughput, then the fit and the errors."""
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.predict import predict_work

    out = []
    for i, row in enumerate(TABLE_1):
        size, heads, hidden, layers, tp, pp, gpus, batch, published = row
        print(f"counting and predicting the {size}B point ({i + 1}/{len(TABLE_1)})", file=sys.stderr, flush=True)
        work = work_of_point(row)
        base = device_profile("A100", gpus)
        step = predict_work(work, base).step_seconds
        flops = paper_flops(batch, layers, hidden)
        out.append({"size": size, "tp": tp, "pp": pp, "dp": gpus // (tp * pp), "gpus": gpus, "batch": batch,
                    "microbatches": batch // (gpus // (tp * pp) * MICROBATCH), "published": published,
                    "datasheet": flops / (step * gpus) / 1e12, "work": work, "base": base, "flops": flops})
    fit = out[:FITTED]
    eta = math.exp(sum(math.log(r["published"] / r["datasheet"]) for r in fit) / len(fit))
    for k, r in enumerate(out):
        step = predict_work(r["work"], scaled(r["base"], eta)).step_seconds
        r["predicted"] = r.pop("flops") / (step * r["gpus"]) / 1e12
        if k < FITTED:  # the scaling is exact: the η profile's step is the datasheet's / η
            assert math.isclose(r["predicted"], eta * r["datasheet"], rel_tol=1e-9), (r["predicted"], r["datasheet"])
        r["error"] = r["predicted"] / r["published"] - 1
        r["role"] = "fitted" if k < FITTED else "predicted"
        del r["work"], r["base"]
    return [dict(r, eta=eta) for r in out]


def table(points: list[dict]) -> str:
    """The markdown table docs/predict.md holds, with the summary lines under it."""
    lines = ["| model | tp | pp | dp | microbatches | published TFLOP/s per GPU | datasheet | fitted (η) | error | "
             "role |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in points:
        lines.append(f"| {r['size']:g}B | {r['tp']} | {r['pp']} | {r['dp']} | {r['microbatches']} | "
                     f"{r['published']} | {r['datasheet']:.1f} | {r['predicted']:.1f} | {r['error']:+.1%} | "
                     f"{r['role']} |")
    held = [abs(r["error"]) for r in points if r["role"] == "predicted"]
    lines += ["", f"η = {points[0]['eta']:.3f} (fitted on the {FITTED} smallest points). On the {len(held)} others: "
              f"mean |error| {sum(held) / len(held):.2%}, worst {max(held):.2%}; Calculon: mean {CALCULON[0]:.2%}, "
              f"worst {CALCULON[1]:.2%} (on the points it was built against)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    print(table(rows()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
