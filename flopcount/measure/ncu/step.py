"""One steady-state step under Nsight Compute: the work of ``python -m flopcount.measure.ncu_step`` (its arguments
are parsed by :mod:`flopcount.cli.ncu_step`).

:func:`run_model` builds the ``--torch`` module on the GPU, runs ``warmup`` steps unprofiled, then brackets exactly
one step with ``torch.cuda.profiler.start()``/``stop()``, its phases marked by process-wide NVTX ranges;
:func:`run_gemm` profiles one matrix product instead (the calibration: its counters must read 2·M·N·K).
"""

from __future__ import annotations

__all__ = ["PRECISIONS", "run_gemm", "run_model"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def _setup(torch, precision: str):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def _profiled(torch, fn) -> None:
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    with torch.autograd.profiler.emit_nvtx():
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def run_gemm(torch, m: int, n: int, k: int, precision: str) -> None:
    half = _setup(torch, precision)
    dtype = half or torch.float32
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    a @ b  # warm-up: cuBLAS handle and heuristics

    def product():
        rid = torch.cuda.nvtx.range_start("flopcount/calibration")
        a @ b
        torch.cuda.nvtx.range_end(rid)

    _profiled(torch, product)


def run_model(torch, args, device: str = "cuda") -> None:
    from flopcount.frontends.torch import forward_inputs, load_factory
    from .crosscheck import float_outputs

    half = _setup(torch, args.precision)
    module = load_factory(args.torch).to(device)
    dtypes = getattr(args, "input_dtypes", None) or {}
    given = {}
    for name, dims in args.input_shape:
        dims = dims if args.batch is None else (args.batch, *dims[1:])
        given[name] = (dims, dtypes[name]) if name in dtypes else dims
    inputs = forward_inputs(module, given, device)  # by forward()'s parameter names
    train = args.mode == "train"
    module.train(train)
    optimizer = None
    if train and args.optimizer:
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = {
            "sgd": lambda: torch.optim.SGD(params, lr=1e-3),
            "momentum": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=1e-3),
            "adamw": lambda: torch.optim.AdamW(params, lr=1e-3),
        }[args.optimizer]()

    def phase(name: str, fn):
        # a process (start/end) range, not a push/pop one: push/pop ranges belong to one thread, and autograd
        # launches the backward kernels from its own device thread, where the main thread's stack is not seen
        rid = torch.cuda.nvtx.range_start(f"flopcount/{name}")
        try:
            return fn()
        finally:
            torch.cuda.nvtx.range_end(rid)

    def forward():
        with torch.autocast(device, dtype=half, enabled=half is not None):
            return module(**inputs)

    def step():
        with torch.set_grad_enabled(train):
            out = phase("forward", forward)
            if not train:
                return
            loss = phase("loss", lambda: sum(t.float().sum() for t in float_outputs(out)))
            phase("backward", loss.backward)
            if optimizer is not None:
                phase("optimizer", optimizer.step)
            module.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    _profiled(torch, step)
