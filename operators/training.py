"""Training operators of domain ``ai.onnx.preview.training``: optimizer steps and Gradient.

An optimizer node updates n tensors X_1 … X_n; its inputs are R, T, then n tensors of each kind
(X, G, then the optimizer's state). Each formula counts the spec's per-element pseudo code once
per element of the X_i, as written (coefficients that happen to be 0 or 1 still count). The
per-call scalar work (learning-rate decay, Adam's bias correction: a few FLOPs and powers,
independent of the tensor sizes) is not counted.
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves_nothing, zero_cost

DOMAIN = "ai.onnx.preview.training"


def _elements(ctx: NodeContext, tensors_per_x: int) -> int:
    """Total elements of the optimized tensors X_1 … X_n (inputs 2 … n + 1)."""
    n = (len(ctx.inputs) - 2) // tensors_per_x
    return sum(ctx.numel(2 + i) for i in range(n))


@formula("Adagrad", family="training", domain=DOMAIN)
def adagrad(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 9·|X| with |X| square roots, |X| = Σ|X_i|: per element G_reg = c·X + G (2),
    H_new = H + G_reg² (2), H_adaptive = sqrt(H_new) + ε (2), X_new = X − r·G_reg/H_adaptive (3).

    Inputs R, T, X_1…n, G_1…n, H_1…n. The decayed rate r = R/(1 + T·decay) is per call, not counted.
    """
    x = _elements(ctx, 3)
    return Cost(flops=9 * x, transcendentals=x)


@formula("Momentum", family="training", domain=DOMAIN)
def momentum(ctx: NodeContext, *, mode: str = "standard", **_) -> Cost:
    """FLOPs = 7·|X| (standard) or 9·|X| (nesterov), |X| = Σ|X_i|: per element G_reg = c·X + G (2),
    V_new = α·V + β·G_reg (3), then X_new = X − R·V_new (2) or X − R·(G_reg + α·V_new) (4).

    Inputs R, T, X_1…n, G_1…n, V_1…n.
    """
    x = _elements(ctx, 3)
    return Cost(flops=(9 if mode == "nesterov" else 7) * x)


@formula("Adam", family="training", domain=DOMAIN)
def adam(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 15·|X| with |X| square roots, |X| = Σ|X_i|: per element G_reg = c·X + G (2),
    V_new = α·V + (1 − α)·G_reg (3), H_new = β·H + (1 − β)·G_reg² (4), H_sqrt = sqrt(H_new) + ε (2),
    X_new = X − R_adj·V_new/H_sqrt (3), X_final = (1 − c_post)·X_new (1).

    Inputs R, T, X_1…n, G_1…n, V_1…n, H_1…n. R_adj = R·sqrt(1 − β^T)/(1 − α^T) is per call, not
    counted.
    """
    x = _elements(ctx, 4)
    return Cost(flops=15 * x, transcendentals=x)


zero_cost(
    "Gradient",
    family="training",
    domain=DOMAIN,
    reason="a placeholder that a training runtime replaces by the backward graph of the tensors named in "
    "xs/zs/y; that graph is not in the model, so its work (typically about twice the forward subgraph's) "
    "is not counted here",
)


@backward("Adagrad", "Momentum", "Adam", domain=DOMAIN)
def optimizer_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: an optimizer node is the update step itself, after the backward pass; nothing is
    differentiated through it (its forward formula counts the update).
    """
    return Cost()



# An optimizer node is the update step, after the backward pass: nothing is differentiated through it, so its
# backward keeps nothing (its states are the optimizer's, not activations).
saves_nothing("Adagrad", "Momentum", "Adam", domain=DOMAIN)
