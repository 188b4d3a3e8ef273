"""Overhead of :class:`flopcount.Meter` on a training loop: the same loop with and without the meter.

Run from the repository root::

    python benchmarks/meter_overhead.py              # tiny MLP + ResNet-50 v1.5 (batch 2, 112x112) on the CPU
    python benchmarks/meter_overhead.py --quick      # tiny MLP only
    python benchmarks/meter_overhead.py --device cuda

Three measurements, each the median of ``--repeat`` rounds after a warm-up round (the loop that runs first
alternates from round to round):

1. **The meter's own work per step**: an empty ``with meter.step(samples=1): pass`` loop against an empty loop.
   This is what the meter adds to every step (two stamps and a few integer updates, a window collection every
   ``window_steps`` steps), in microseconds. Target: under 5 us per step on a CPU.
2. **A tiny model** (a 64-wide MLP at batch 4: steps of tens of microseconds) trained with and without the meter:
   the A/B ratio shows the overhead where it is most visible.
3. **ResNet-50 v1.5** (the bundled workload's model) trained with and without the meter. Its steps last a second
   or more on a CPU, so the A/B difference is below the machine's run-to-run noise; the overhead as a share of the
   step time is therefore given as (1)'s cost / the measured step time. Target: under 1%.

The last line reads ``overhead: X% of step time, Y us per step`` (X for ResNet-50, Y from (1)). Nothing asserts:
this prints figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import flopcount


def empty_loop(steps: int, meter: flopcount.Meter | None) -> float:
    t0 = time.perf_counter()
    if meter is None:
        for _ in range(steps):
            pass
    else:
        for _ in range(steps):
            with meter.step(samples=1):
                pass
    return time.perf_counter() - t0


def train_loop(model, x, y, steps: int, meter: flopcount.Meter | None) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    if meter is None:
        for _ in range(steps):
            step()
    else:
        for _ in range(steps):
            with meter.step(samples=len(x)):
                step()
    sync()
    return time.perf_counter() - t0


def new_meter(device: str) -> flopcount.Meter:
    return flopcount.Meter(flops_per_sample=1, device=device, warmup_steps=5, window_steps=20, energy=False)


def ab(label: str, run, steps: int, repeat: int, device: str) -> tuple[float, float]:
    """Median seconds per step without and with the meter, alternating rounds after a warm-up round."""
    run(max(1, steps // 10), None)
    run(max(1, steps // 10), new_meter(device))
    bare, metered = [], []
    for i in range(repeat):  # ABBA order: which loop runs first alternates, so order effects cancel
        if i % 2:
            metered.append(run(steps, new_meter(device)) / steps)
            bare.append(run(steps, None) / steps)
        else:
            bare.append(run(steps, None) / steps)
            metered.append(run(steps, new_meter(device)) / steps)
    b, m = statistics.median(bare), statistics.median(metered)
    print(f"{label:<28} {b * 1e6:12.2f} us {m * 1e6:12.2f} us {(m - b) * 1e6:+10.2f} us {(m / b - 1):+9.2%}")
    return b, m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="skip ResNet-50")
    args = p.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(f"{'loop':<28} {'without':>15} {'with meter':>15} {'difference':>13} {'ratio':>10}")
    b, m = ab("empty step", lambda n, meter: empty_loop(n, meter), 200_000, args.repeat, args.device)
    own_us = (m - b) * 1e6

    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    x, y = torch.randn(4, 64, device=device), torch.randint(0, 10, (4,), device=device)
    ab("tiny MLP (batch 4)", lambda n, meter: train_loop(mlp, x, y, n, meter), 2_000, args.repeat, args.device)

    share = None
    if not args.quick:
        from flopcount.models.resnet import resnet50

        net = resnet50().to(device)
        x, y = torch.randn(2, 3, 112, 112, device=device), torch.randint(0, 1000, (2,), device=device)
        steps = 5 if device.type == "cpu" else 50
        b, _ = ab("ResNet-50 v1.5 (2x3x112x112)", lambda n, meter: train_loop(net, x, y, n, meter), steps,
                  max(3, args.repeat // 2), args.device)
        share = own_us * 1e-6 / b
        print(f"ResNet-50 step {b * 1e3:.1f} ms; the meter's own {own_us:.2f} us per step is {share:.5%} of it "
              "(the A/B difference above is within run-to-run noise)")
    print(f"overhead: {'n/a' if share is None else f'{share * 100:.4f}'}% of step time, {own_us:.2f} us per step")


if __name__ == "__main__":
    main()
