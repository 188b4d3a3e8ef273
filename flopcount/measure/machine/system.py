"""The system under test, as the HPC AI500 reporting procedure asks for it: CPU model and cores, accelerators,
driver and CUDA versions, memory, OS, framework versions, node and rank counts, interconnect where it can be read.

Everything here is read, never assumed: what cannot be read is absent or ``None``.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

from .devices import Device, cpu_cores, cpu_name

#: Packages whose versions a report records when they are installed.
SOFTWARE = ("flopcount", "torch", "onnx", "onnxruntime", "numpy", "scikit-learn", "lightning", "tensorflow-cpu",
            "tensorflow", "keras", "nvidia-ml-py")


def memory_bytes() -> int | None:
    """Physical memory (Linux /proc/meminfo), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def software() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in SOFTWARE:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.version.cuda:
            out["cuda"] = torch.version.cuda
        cudnn = getattr(torch.backends, "cudnn", None)
        if cudnn is not None and torch.cuda.is_available():
            out["cudnn"] = str(cudnn.version())
        if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
            try:
                out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # NCCL absent from this build
                pass
    return out


def topology() -> dict[str, object]:
    """Nodes, ranks and ranks per node from torch.distributed when it runs, else from the launcher's environment
    (torchrun: WORLD_SIZE, LOCAL_WORLD_SIZE; SLURM: SLURM_NNODES, SLURM_NTASKS); one node and one rank otherwise."""
    env = os.environ
    ranks = 1
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        ranks = dist.get_world_size()
    elif env.get("WORLD_SIZE", "").isdigit():
        ranks = int(env["WORLD_SIZE"])
    per_node = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").isdigit() else None
    if env.get("SLURM_NNODES", "").isdigit():
        nodes = int(env["SLURM_NNODES"])
    elif per_node:
        nodes = max(1, ranks // per_node)
    else:
        nodes = 1
        per_node = ranks
    return {"nodes": nodes, "ranks": ranks, "ranks_per_node": per_node, "interconnect": interconnect()}


def interconnect() -> dict[str, object] | None:
    """What can be read of the links between ranks: the torch.distributed backend, the NCCL/gloo socket interface
    and InfiniBand devices with their port rates."""
    out: dict[str, object] = {}
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        out["backend"] = dist.get_backend()
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET"):
        if os.environ.get(var):
            out[var] = os.environ[var]
    try:
        ib = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        ib = []
    if ib:
        out["infiniband"] = ib
        rates = {}
        for dev in ib:
            try:
                with open(f"/sys/class/infiniband/{dev}/ports/1/rate", encoding="ascii") as f:
                    rates[dev] = f.read().strip()  # e.g. "400 Gb/sec (4X NDR)"
            except OSError:
                pass
        if rates:
            out["infiniband_rate"] = rates
    return out or None


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process (each rank sets its own; torchrun's default is 1), or None when torch
    is not imported: a CPU run's compute ceiling scales with the cores its ranks use."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def describe_system(device: Device | None = None) -> dict[str, object]:
    """The ``system`` object of a report: CPU, memory, OS, software, the accelerator (when ``device`` is one) and
    the topology (nodes, ranks)."""
    accelerators = [device.as_dict()] if device is not None and device.kind != "cpu" else []
    out: dict[str, object] = {
        "cpu": {"model": cpu_name(), "cores": cpu_cores(), "logical_cpus": os.cpu_count(),
                "torch_threads": _torch_threads()},
        "memory_bytes": memory_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "accelerators": accelerators,
        "device": device.as_dict() if device is not None else None,
        "software": software(),
    }
    out.update(topology())
    return out
