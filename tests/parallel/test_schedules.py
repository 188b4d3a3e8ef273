"""The pipeline schedules' fast timing (each rank run as far as what it needs is done) against the simulation action
by action (:func:`flopcount.parallel.schedules._run_schedule`), and both against closed forms."""

import random

import pytest

from flopcount.parallel.schedules import _run_schedule, simulated_schedule


def _cases():
    rng = random.Random(7)
    for schedule in ("gpipe", "1f1b", "interleaved"):
        for p in (1, 2, 3, 4, 8):
            for v in ((1, 2, 3, 5) if schedule == "interleaved" else (1,)):
                for m in (1, 2, 3, 4, 6, 8, 9, 16, 24):
                    for train in (True, False):
                        yield schedule, p, v, m, train, rng.randrange(1 << 30)


@pytest.mark.parametrize("schedule,p,v,m,train,seed", list(_cases()))
def test_timed_equals_the_simulation(schedule, p, v, m, train, seed):
    """Unequal chunk lengths (integers and fractions): the same makespan and busy times, to the bit, and the same
    actions listed when read."""
    rng = random.Random(seed)
    forward = [rng.choice([1, 3, 0.25, rng.random() * 10]) for _ in range(p * v)]
    backward = [rng.random() * 20 if train else 0.0 for _ in range(p * v)]
    try:
        makespan, busy, actions = _run_schedule(schedule, p, m, forward, backward, v)
    except RuntimeError:  # an order that cannot run (interleaved of M not a multiple of P): the same refusal
        with pytest.raises(RuntimeError, match="deadlocked"):
            simulated_schedule(schedule, p, m, forward, backward, v)
        return
    run = simulated_schedule(schedule, p, m, forward, backward, v)
    assert (run.makespan, run.busy) == (makespan, busy)
    assert run.actions == actions
    assert max(a.end for a in actions) == makespan


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (3, 7), (8, 16)])
def test_closed_forms(p, m):
    """Equal chunks of forward f and backward b: 1F1B and GPipe last (M + P − 1)·(f + b), each rank busy M·(f + b);
    interleaved with v chunks of f/v and b/v: (M + (P − 1)/v)·(f + b) (Narayanan et al. 2021, the bubble
    (P − 1)/(v·M) of the ideal step)."""
    f, b = 2.0, 4.0
    for schedule in ("1f1b", "gpipe"):
        run = simulated_schedule(schedule, p, m, [f] * p, [b] * p)
        assert run.makespan == (m + p - 1) * (f + b)
        assert run.busy == (m * (f + b),) * p
    if m % p == 0:
        v = 2
        run = simulated_schedule("interleaved", p, m, [f / v] * (p * v), [b / v] * (p * v), v)
        assert run.makespan == pytest.approx((m + (p - 1) / v) * (f + b))


@pytest.mark.parametrize("schedule,p,v,m,train,seed", list(_cases()))
def test_numbered_orders_are_the_orders(schedule, p, v, m, train, seed):
    """The orders :func:`_timed` runs, as numbers, are :func:`_orders`' (kind, virtual stage, microbatch)."""
    from flopcount.parallel.schedules import _orders, _steps

    stride, steps, _ = _steps(schedule, p, m, v, train)
    decoded = [[("B" if a & 1 else "F", (a >> 1) // stride, (a >> 1) % stride) for a in order] for order in steps]
    assert decoded == _orders(schedule, p, m, v, train)
