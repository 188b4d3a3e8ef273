"""onnxruntime: the module (with the execution provider asked for), a session at an optimisation level, one run,
and the per-node times of its profiler's trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flopcount.errors import DeviceError, MeasurementError, UsageError, first_line

__all__ = ["OPTIMIZE_LEVELS", "PROVIDERS", "SessionSpec", "import_ort", "open_session", "parse_profile",
           "run_session"]

OPTIMIZE_LEVELS = ("none", "basic", "extended", "all")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def import_ort(provider: str):
    try:
        import onnxruntime as ort
    except ImportError:
        raise DeviceError("profiling needs onnxruntime: pip install onnxruntime (onnxruntime-gpu for --provider "
                          "cuda)") from None
    if provider not in PROVIDERS:
        raise UsageError(f"--provider {provider!r}: expected one of {', '.join(PROVIDERS)}")
    if PROVIDERS[provider] not in ort.get_available_providers():
        raise DeviceError(f"--provider {provider}: this onnxruntime has no {PROVIDERS[provider]} (it offers "
                          f"{', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu in place of "
                          "onnxruntime")
    return ort


@dataclass(frozen=True)
class SessionSpec:
    """What an onnxruntime session is opened on: the module (:func:`import_ort`), the serialized model, the
    execution provider, the optimisation level (one of :data:`OPTIMIZE_LEVELS`), the intra-op threads (None:
    onnxruntime's own) and the model's name for messages."""

    ort: Any
    model_bytes: bytes
    provider: str
    optimize: str
    threads: int | None = None
    where: str = "<model>"


def open_session(spec: SessionSpec, profile_prefix: str | None = None, optimized_path: str | None = None):
    """A session of ``spec``; with ``profile_prefix`` its profiler on (traces named from it), with
    ``optimized_path`` the optimised graph written there."""
    ort, optimize, threads = spec.ort, spec.optimize, spec.threads
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimize]
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    # Idle pool threads sleep instead of spinning: spinning threads take cores from the ones doing the work
    # whenever the machine has other load, which makes times erratic; on an idle machine this costs little.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    try:
        return ort.InferenceSession(spec.model_bytes, so, providers=[PROVIDERS[spec.provider]])
    except Exception as e:  # onnxruntime raises its own exception types
        raise MeasurementError(f"{spec.where}: onnxruntime cannot load the model: {first_line(e)}") from None


def run_session(session, feeds, where: str):
    try:
        session.run(None, feeds)
    except Exception as e:
        raise MeasurementError(f"{where}: onnxruntime failed to run the model: {first_line(e)}") from None


def parse_profile(events: list[dict], warmup: int) -> tuple[list[dict[str, float]], list[float], dict[str, str]]:
    """Per timed run, seconds per node name (kernel time; on CUDA the GPU kernels' time when onnxruntime reports
    them), the profiled run times, and node name → provider. The first ``warmup`` ``model_run`` events are
    skipped; a node's events are assigned to the run whose span holds them."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    runs = runs[warmup:]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    providers: dict[str, str] = {}
    gpu = [e for e in events if e.get("cat") == "Kernel" and (e.get("args") or {}).get("parent_name")]
    if gpu:
        items = [(e["ts"], e["args"]["parent_name"], e["dur"]) for e in gpu]
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                providers[e["name"][: -len("_kernel_time")]] = (e.get("args") or {}).get("provider", "")
    else:
        items = []
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                name = e["name"][: -len("_kernel_time")]
                items.append((e["ts"], name, e["dur"]))
                providers[name] = (e.get("args") or {}).get("provider", "")
    starts = [a for a, _ in runs]
    import bisect

    for ts, name, dur in items:
        k = bisect.bisect_right(starts, ts) - 1
        if k < 0 or ts > runs[k][1] + 1e3 and not gpu:  # before the timed runs, or in no run (warm-up)
            continue
        per_run[k][name] = per_run[k].get(name, 0.0) + dur * 1e-6
    return per_run, [(b - a) * 1e-6 for a, b in runs], providers
