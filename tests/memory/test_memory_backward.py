"""The backward as torch's engine runs it: which nodes' backward runs (a branch whose outputs reach no loss keeps
nothing) and how an activation read by several consumers gets its gradient (each consumer's added out of place),
checked against one real training step on this CPU: the unique storages torch's autograd keeps, and MemTracker's
peak."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._tools.mem_tracker")

import flopcount  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages, tracked_step  # noqa: E402

F32 = 4
T, E, H, GROUPS = 6, 8, 5, 4  # tokens, experts, hidden, expert groups: distinct


def rank_of(module, inputs):
    """The ledger's figures of one SGD step of ``module`` (no optimizer states to interfere)."""
    report = flopcount.from_torch(module.train(), inputs, training=True, optimizer="sgd", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0]


class Router(torch.nn.Module):
    """A group-limited router as DeepSeek-V3 writes it: the groups' best scores (a top-2 whose values are summed),
    the best group (a top-1 of which only the index is read on), a mask made of it and the masked scores' top-2, of
    which only the indices are read on (to gather the weights from the scores themselves)."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False)

    def forward(self, x):
        scores = self.gate(x).sigmoid()  # [T, E]
        groups = scores.view(T, GROUPS, E // GROUPS).topk(2, dim=-1)[0].sum(dim=-1)  # [T, GROUPS]
        best = groups.topk(1, dim=-1)[1]  # [T, 1]
        mask = torch.zeros_like(groups).scatter(1, best, 1.0)
        mask = mask.unsqueeze(-1).expand(T, GROUPS, E // GROUPS).reshape(T, E)
        chosen = scores.masked_fill(~mask.bool(), 0.0).topk(2, dim=-1)[1]  # [T, 2]
        return scores.gather(1, chosen).sum()


def test_a_branch_that_reaches_no_loss_keeps_nothing():
    """torch frees the top-k's, the sum's and the masked fill's backward with their outputs in the forward (only
    integers are read on): what is kept is the gate's input x (for the weight's gradient), the sigmoid's output
    (its own gradient, and the gather's source is that tensor) and the gather's int64 indices [T, 2]; the groups'
    top-2 indices, the best group's and the bool mask [T, E] are not."""
    x = torch.randn(T, H)
    kept = F32 * T * H + F32 * T * E + 8 * T * 2
    assert saved_storages(Router(), (x,)) == kept
    assert rank_of(Router(), (x,)).activations_bytes == kept


class Scan(torch.nn.Module):
    """A recurrence reading one step of ``u = x·w`` ([N, H, S]) at a time with a select, as Mamba's scan reads its
    discretized inputs: every select's backward makes a whole [N, H, S] gradient of ``u``, which the engine adds
    into the gradient the later steps made (``old + new``)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(H, 1))

    def forward(self, x):
        u = x * self.w
        state = u[:, :, 0]
        for i in range(1, x.shape[-1]):
            state = state * u[:, :, i]
        return state.sum()


@pytest.mark.parametrize("steps", [3, 6])
def test_each_select_of_a_scan_adds_a_whole_gradient_out_of_place(steps):
    """The peak is in the selects' backward: the gradient of ``u`` the later steps made, the one this select made
    and their sum (N·H·S floats each) beside what is kept and the small gradients of the state."""
    x = torch.randn(16, H, steps)
    module = Scan().train()
    rank = rank_of(module, (x,))
    assert rank.peak_phase == "backward"
    # MemTracker's peak of one SGD step (after a first)
    assert rank.peak_bytes - rank.inputs_bytes == tracked_step(module, lambda: module(x), torch.optim.SGD).peak


N = 32  # rows of the shared activation


class Shared(torch.nn.Module):
    """One activation ``y = x·w`` ([N, H]) read by two products, each of which keeps it for its weight's gradient
    and gives it a whole [N, H] gradient."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(H))
        self.a = torch.nn.Linear(H, 1, bias=False)
        self.b = torch.nn.Linear(H, 1, bias=False)

    def forward(self, x):
        y = x * self.w
        return (self.a(y) + self.b(y)).pow(2).sum()


def test_a_node_releases_what_it_kept_before_its_gradient_is_added():
    """torch's engine releases a node's saved tensors as soon as its backward returns, before it adds the gradient
    it gives into the one another consumer made: when the first product's backward (the last to run) has made the
    second gradient of ``y``, y is freed (no backward keeps it any more) before ``old + new`` is made. So the peak
    is at that product's backward, y and the two gradients alive (3·N·H floats besides the weights, the small
    gradients and x), not at the sum, where y would make it 4·N·H."""
    x = torch.randn(N, H)
    module = Shared().train()
    rank = rank_of(module, (x,))
    assert rank.peak_phase == "backward" and rank.peak_node.endswith("/a/MatMul")
    assert rank.peak_bytes - rank.inputs_bytes == tracked_step(module, lambda: module(x), torch.optim.SGD).peak
