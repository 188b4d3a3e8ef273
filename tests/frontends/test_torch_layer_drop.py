"""A hand-built stack that drops each of its layers with probability p in training (its ``forward`` reads its own
``self.layerdrop``, a branch on ``torch.rand``) counted through ``from_torch`` (:func:`flopcount.frontends.torch.
count_module`, which ``--torch`` runs too): exported with every layer, as ``--hf`` exports transformers' layer-drop
stacks (:mod:`flopcount.frontends.train_export`), its products equal torch's FlopCounterMode over a training step
that drops no layer, and the report says so in the same note."""

from __future__ import annotations

import pytest
from helpers import products_only

torch = pytest.importorskip("torch")

LAYERS, WIDTH, BATCH, P = 8, 16, 4, 0.5


class DropStack(torch.nn.Module):
    """``LAYERS`` linear layers with ReLU, each skipped with probability ``self.layerdrop`` in training."""

    def __init__(self, p: float = P):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))
        self.layerdrop = p

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            x = torch.relu(layer(x))
        return x


def count(mode: str):
    import flopcount

    torch.manual_seed(0)
    return flopcount.from_torch(DropStack().train(mode == "train"), (BATCH, WIDTH), mode=mode, cache_dir=False)


def every_layer_step() -> int:
    """FlopCounterMode's FLOPs of a training step (forward and backward) of the stack with no layer dropped."""
    from torch.utils.flop_counter import FlopCounterMode

    stack = DropStack(p=0.0).train()
    with FlopCounterMode(display=False) as counter:
        stack(torch.randn(BATCH, WIDTH)).sum().backward()
    return counter.get_total_flops()


def test_training_count_runs_every_layer_with_a_note():
    report = count("train")
    products = products_only(report)
    assert sum(n.cost.flops + n.backward.flops for n in products.nodes) == every_layer_step()
    # every layer: forward 2·B·W² each, backward its weight's gradient and (but the first) its input's
    assert every_layer_step() == 2 * BATCH * WIDTH * WIDTH * (LAYERS + LAYERS + LAYERS - 1)
    assert [n for n in report.notes if n.startswith("layer drop")] == [
        f"layer drop: in training, the model (DropStack) p = {P:g} skip(s) each of its layers with probability p; "
        "the count is of the step that runs every layer, and the expected step runs (1 - p) of those layers' work"]


def test_layer_drop_is_restored_and_inference_has_no_note():
    from flopcount.frontends import torch as frontend
    from flopcount.options import CountOptions

    stack = DropStack().train()
    frontend.count_module(stack, (BATCH, WIDTH), CountOptions(mode="train"), cache_dir=False)
    assert stack.layerdrop == P and stack.training
    report = count("inference")
    assert not [n for n in report.notes if n.startswith("layer drop")]
    assert sum(n.cost.flops for n in products_only(report).nodes) == 2 * BATCH * WIDTH * WIDTH * LAYERS
