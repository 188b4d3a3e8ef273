"""Signal processing: DFT, STFT, window functions and the mel filter bank.

Fourier transforms use the usual FFT cost convention (FFTW's "mflops" count): one complex transform
of length N costs 5·N·log2(N) real FLOPs, for every N (radix-2 exact, others by the same formula,
rounded to an integer per transform). A transform with a real side, a real input (RFFT, or any
transform of a real signal) or a real output (IRFFT), costs half, 2.5·N·log2(N): it is computed as
a complex transform of length N/2 plus O(N) twiddles. Twiddle factors are precomputed constants
and are not counted as transcendentals.
"""

from __future__ import annotations

from math import log2, prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.errors import ShapeError
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, keeps


def fft_flops(n: int, real: bool) -> int:
    """5·N·log2(N) real FLOPs for a complex FFT of length N; half for a real-sided one."""
    return round((2.5 if real else 5) * n * log2(n)) if n > 1 else 0


def _scalar(ctx: NodeContext, i: int) -> int | None:
    v = ctx.value(i)
    return None if v is None else int(v.reshape(-1)[0])


def _unknown(ctx: NodeContext, what: str, i: int) -> ShapeError:
    return ShapeError(
        f"node {ctx.name!r} ({ctx.op_type}): input {i} ({what}) is not a constant, and with a one-sided "
        f"output its value cannot be read off the output shape; make it a constant or pass its value "
        f"(input_values=...)"
    )


@formula("DFT", family="signal")
def dft(ctx: NodeContext, *, inverse: int = 0, onesided: int = 0, axis: int = 1, **_) -> Cost:
    """FLOPs = T·5·N·log2(N) for T = |X|/(X_axis·X_last) transforms of length N = dft_length
    (default: the axis length; 2·(X_axis − 1) for IRFFT); T·2.5·N·log2(N) when the input is real
    (last dim 1) or the output is (IRFFT: onesided=1, inverse=1); the inverse adds |Y| (the 1/N
    scaling of each output value).

    One-sided output (RFFT) changes only the output size, not the transform work, beyond counting
    it as real-input. Zero-padding or truncating to dft_length is not counted. The axis is the
    ``axis`` attribute before opset 20 and the ``axis`` input (default −2) from opset 20.
    """
    x = ctx.shape(0)
    if ctx.opset >= 20:
        given = _scalar(ctx, 2) if ctx.has_input(2) else -2
        if given is None:
            raise _unknown(ctx, "axis", 2)
        axis = given
    a = axis % len(x)
    irfft = bool(onesided and inverse)
    if ctx.has_input(1):
        n = _scalar(ctx, 1)
        if n is None:
            if onesided and not inverse:
                raise _unknown(ctx, "dft_length", 1)
            n = ctx.out_shape()[a]
    else:
        n = 2 * (x[a] - 1) if irfft else x[a]
    transforms = prod(x) // (x[a] * x[-1])
    flops = transforms * fft_flops(n, real=x[-1] == 1 or irfft)
    if inverse:
        flops += ctx.out_numel()
    return Cost(flops=flops)


@backward("DFT")
def dft_backward(ctx: NodeContext, *, inverse: int = 0, onesided: int = 0, axis: int = 1, **_) -> Cost:
    """FLOPs = the forward's, T·5·N·log2(N) (halved with a real side) (+ |Y| for the inverse's 1/N),
    when the input needs a gradient: the DFT is linear, and its adjoint is the transform of the
    opposite direction over the same T transforms of length N, with the same real side.

    The adjoint of a real-input transform is a real-output one (and of IRFFT, RFFT), so the halving
    carries over; the inverse's 1/N scaling is applied once more (to dY). Re-weighting the bins of a
    one-sided spectrum and zero-padding or truncating to dft_length (O(N)) are not counted. The ONNX
    schema marks every DFT input non-differentiable, so a training count built from the schema never
    asks for this gradient; the formula states what it would cost.
    """
    return dft(ctx, inverse=inverse, onesided=onesided, axis=axis) if ctx.needs_grad(0) else Cost()


@formula("STFT", family="signal")
def stft(ctx: NodeContext, *, onesided: int = 1, **_) -> Cost:
    """FLOPs = B·F·(5·N·log2(N) + c·N) for output [B, F, bins, 2], frame length N and c = X_last
    real multiplies per sample by the window (c = 0 without a window); the FFT term is halved,
    2.5·N·log2(N), for a real signal (last dim 1).

    N is the window length, else the ``frame_length`` value, else the signal length. Each of the
    B·F frames is multiplied by the window (1 FLOP per real sample, 2 per complex one) and
    transformed; framing (strided copies) is not counted.
    """
    x = ctx.shape(0)
    b, frames = ctx.out_shape()[:2]
    n = _frame_length(ctx, onesided)
    window = n * x[-1] if ctx.has_input(2) else 0
    return Cost(flops=b * frames * (fft_flops(n, real=x[-1] == 1) + window))


def _frame_length(ctx: NodeContext, onesided: int) -> int:
    """STFT's N: the window length, else the ``frame_length`` value, else the signal length."""
    if ctx.has_input(2):
        return ctx.shape(2)[0]
    if ctx.has_input(3):
        n = _scalar(ctx, 3)
        if n is None:
            if onesided:
                raise _unknown(ctx, "frame_length", 3)
            n = ctx.out_shape()[2]
        return n
    return ctx.shape(0)[1]


@backward("STFT")
def stft_backward(ctx: NodeContext, *, onesided: int = 1, **_) -> Cost:
    """FLOPs = B·F·(5·N·log2(N) + (w + 1)·c·N·[signal] + 2·c·N·[window]) when the signal or the window
    needs a gradient, with the forward's B, F, N and c = X_last, w = 1 with a window (else 0), the
    FFT term halved for a real signal and [·] = 1 for an input that needs a gradient.

    Each frame's spectrum gradient is transformed back by the adjoint FFT (the forward's transform
    cost, once for both inputs); the signal's gradient multiplies it by the window (c·N per frame,
    with a window) and overlap-adds the frames into dX (c·N additions per frame, the first write
    included, as for every scatter-add); the window's gradient sums dframe·x over the B·F frames
    (a multiply and an addition per real component). frame_step and frame_length are integers. The
    ONNX schema marks every STFT input non-differentiable, so a training count built from the schema
    never asks for these gradients; the formula states what they would cost.
    """
    g_signal, g_window = ctx.needs_grad(0), ctx.has_input(2) and ctx.needs_grad(2)
    if not (g_signal or g_window):
        return Cost()
    x = ctx.shape(0)
    b, frames = ctx.out_shape()[:2]
    n = _frame_length(ctx, onesided)
    samples = n * x[-1]
    per_frame = fft_flops(n, real=x[-1] == 1)
    if g_signal:
        per_frame += (1 + ctx.has_input(2)) * samples
    if g_window:
        per_frame += 2 * samples
    return Cost(flops=b * frames * per_frame)


# window op → (FLOPs, transcendentals) per output element
WINDOWS: dict[str, tuple[int, int]] = {
    "HannWindow": (4, 1),  # θ = n·2π/N, cos θ, a0 − a1·cos θ
    "HammingWindow": (4, 1),
    "BlackmanWindow": (8, 2),  # θ, 2θ, cos θ, cos 2θ, two multiplies, two adds
}


@formula(*WINDOWS, family="signal")
def window(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 4·|Y| with |Y| transcendentals (Hann, Hamming: θ = n·2π/N, cos θ, a0 − a1·cos θ);
    8·|Y| with 2·|Y| transcendentals (Blackman: θ and 2θ, two cosines, two multiplies, two adds).

    The constant 2π/N is computed once and not counted; the cast to ``output_datatype`` is free.
    """
    flops, trans = WINDOWS[ctx.op_type]
    y = ctx.out_numel()
    return Cost(flops=flops * y, transcendentals=trans * y)


@formula("MelWeightMatrix", family="signal")
def mel_weight_matrix(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 6·|Y| + 8·(M + 2) with M + 2 transcendentals, for the output
    [dft_length/2 + 1, M] of M = num_mel_bins triangular filters.

    Each output element evaluates its triangle densely, max(0, min((f − l)/(c − l), (r − f)/(r − c))):
    2 subtractions, 2 divisions, 1 min, 1 max (the ONNX reference touches only the non-zero entries
    and does less). Each of the M + 2 band edges is spaced on the mel scale (2 FLOPs), converted to
    Hz, 700·(exp(m·ln10/2595) − 1) (4 FLOPs, one exp), and to a DFT bin (2). The two Hz → mel
    conversions of the band limits are not counted.
    """
    mel_bins = ctx.out_shape()[1]
    return Cost(flops=6 * ctx.out_numel() + 8 * (mel_bins + 2), transcendentals=mel_bins + 2)


@saves("DFT")
def dft_saved(ctx: NodeContext, **_) -> Saved:
    """A real signal (last dim 1), whose gradient is the real part of the transform's adjoint (torch's real-to-
    complex FFT keeps its input); nothing for a complex one, as the transform is linear."""
    x = ctx.shape(0)
    return keeps(0) if x and x[-1] == 1 else Saved()


@saves("STFT")
def stft_saved(ctx: NodeContext, **_) -> Saved:
    """The window, for the signal's gradient (the frames' gradients are multiplied by it), and the signal, for the
    window's (Σ dframe·x): the transform is linear in each."""
    window = ctx.has_input(2)
    return keeps(*((2,) if window and ctx.needs_grad(0) else ()), *((0,) if window and ctx.needs_grad(2) else ()))
