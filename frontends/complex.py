"""Complex arithmetic as pairs of real numbers, for the export only.

ONNX has no complex tensors, and torch's exporters cannot convert ``torch.polar``, ``torch.view_as_complex`` or a
product of complex tensors (Llama 4's rotary embedding is written that way: ``freqs_cis = torch.polar(1, θ)``,
``view_as_real(view_as_complex(q) * freqs_cis)``). While :func:`complex_as_pairs` is active, those functions make
and take a :class:`Pair` instead: a real tensor whose last dimension of 2 holds the real and imaginary parts, on
which the same arithmetic runs as real operations:

* ``polar(r, θ)`` is ``r·cos θ`` and ``r·sin θ`` (two products, a cosine and a sine per element, as eagerly);
* ``(a + bi)(c + di)`` is ``ac − bd`` and ``ad + bc``: four products and two sums per element, which is what
  a complex product costs in real FLOPs; a complex number times a real one is two products;
* ``view_as_complex`` and ``view_as_real`` only re-label the data (no arithmetic), as eagerly.

So the exported graph computes the same values with the same real operations, and counts exactly. Anything else
asked of a :class:`Pair` is refused with a message naming it, so that a model whose complex arithmetic goes beyond
these operations fails to export rather than being counted wrongly.

torch is imported inside the functions; importing this module needs nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["Pair", "complex_as_pairs"]


class Pair:
    """A complex tensor held as a real tensor ``data`` of shape ``[*shape, 2]`` (real, imaginary)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    @property
    def shape(self):
        return self.data.shape[:-1]

    @property
    def device(self):
        return self.data.device

    def dim(self) -> int:
        return self.data.dim() - 1

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def to(self, *args: Any, **kwargs: Any) -> Pair:
        """Moves between devices; a complex dtype keeps it complex, a real one would drop the imaginary part and is
        refused."""
        import torch

        dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
        if dtype is not None and not dtype.is_complex:
            raise TypeError(f"complex_as_pairs: casting a complex tensor to {dtype} is not supported in the export")
        device = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
        return self if device is None else Pair(self.data.to(device))

    def __getitem__(self, index) -> Pair:
        if not isinstance(index, tuple):
            index = (index,)
        return Pair(self.data[(*index, slice(None))])  # the trailing pair dimension kept whole

    def __mul__(self, other) -> Pair:
        import torch

        if isinstance(other, Pair):
            a, b = self.data.unbind(-1)
            c, d = other.data.unbind(-1)
            return Pair(torch.stack((a * c - b * d, a * d + b * c), dim=-1))
        if isinstance(other, torch.Tensor):
            if other.is_complex():
                raise TypeError("complex_as_pairs: a complex tensor met a pair of real ones in the export")
            return Pair(self.data * other.unsqueeze(-1))
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Pair(self.data * other)
        return NotImplemented

    __rmul__ = __mul__

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch functions given a pair: ``view_as_real`` gives its data, a product is the pair's; the rest is
        refused (by name)."""
        import torch

        kwargs = kwargs or {}
        if func is torch.view_as_real:
            return _view_as_real(*args, **kwargs)
        if func in (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__) and len(args) == 2:
            pair = next(a for a in args if isinstance(a, Pair))
            return pair * next(a for a in args if a is not pair)
        raise TypeError(f"complex_as_pairs: {getattr(func, '__name__', func)} of a complex tensor is not supported "
                        "in the export")

    def __getattr__(self, name: str):
        raise AttributeError(f"complex_as_pairs: {name} of a complex tensor is not supported in the export")


def _polar(magnitude, angle) -> Pair:
    import torch

    return Pair(torch.stack((magnitude * torch.cos(angle), magnitude * torch.sin(angle)), dim=-1))


def _view_as_complex(x) -> Pair:
    if x.shape[-1] != 2:
        raise ValueError(f"view_as_complex needs a last dimension of 2, got shape {tuple(x.shape)}")
    return Pair(x)


def _view_as_real(x):
    if not isinstance(x, Pair):
        raise TypeError("complex_as_pairs: view_as_real of a complex tensor made outside the export's pairs")
    return x.data


@contextlib.contextmanager
def complex_as_pairs():
    """While active, ``torch.polar``, ``torch.view_as_complex`` and ``torch.view_as_real`` make and take
    :class:`Pair` values (see the module docstring); every other torch function runs as it is."""
    import torch
    from torch.overrides import TorchFunctionMode

    made = {torch.polar: _polar, torch.view_as_complex: _view_as_complex, torch.view_as_real: _view_as_real}

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            replacement = made.get(func)
            if replacement is not None:
                return replacement(*args, **kwargs)
            if any(isinstance(a, Pair) for a in (*args, *kwargs.values())):
                return Pair.__torch_function__(func, types, args, kwargs)
            return func(*args, **kwargs)

    with Mode():
        yield
