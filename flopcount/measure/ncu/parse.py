"""Nsight Compute (``ncu``) exports: the metrics that count floating-point work, the command that collects them,
and a parser of both CSV layouts that turns each kernel's counters into FLOPs.

Conventions (stated in every crosscheck report, see ``docs/crosscheck.md``):

* CUDA-core instructions are counted per thread with predicated-off threads excluded
  (``sm__sass_thread_inst_executed_op_<p><op>_pred_on.sum``): FLOPs = add + mul + 2 · fma, per precision
  (``f`` fp32, ``d`` fp64, ``h`` half: fp16 or bf16).
* Half-precision instructions: ``HADD2``/``HMUL2``/``HFMA2`` work on a *pair* of values. ``pairs`` (the default)
  doubles them: 2 · hadd + 2 · hmul + 4 · hfma, as nvprof's ``flop_count_hp`` counted a packed FMA as 4; ``single``
  counts each instruction once (hadd + hmul + 2 · hfma), the expression of the achieved work in ncu's half-precision
  roofline section (``derived__smsp__sass_thread_inst_executed_op_hfma_pred_on_x2``). Which one a given GPU's
  counters need is not documented: it is to be settled on a GPU with a kernel of known packed-half work. PyTorch's
  element-wise kernels compute half tensors in fp32, so in a PyTorch step the half counters are mostly zero.
* Tensor cores: ``sm__ops_path_tensor_src_<type>...`` counts operations, one per FLOP (a multiply-accumulate is 2).
  Integer source types (int8, int4, b1) are not floating-point work and are left out.
* An aggregate is never added to its own parts: among the tensor metrics of one source type, a metric whose
  qualifiers (``op_<instr>``, ``dst_<type>``, ``sparsity_on|off``) are a subset of another's is its aggregate, and
  only the most aggregated non-overlapping metrics are summed. Names are matched by pattern, so the metric names of
  several ncu versions (``smsp__`` or ``sm__`` prefixes, with or without ``_sparsity_off``) work.

Nothing here imports torch or runs ncu; :mod:`flopcount.cli.crosscheck` does.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from flopcount.errors import MeasurementError

#: CUDA-core instruction metrics: ``<p><op>`` for p in f, d, h and op in add, mul, fma.
CUDA_CORE_RE = re.compile(r"^sm(?:sp)?__sass_thread_inst_executed_op_(?P<p>[fdh])(?P<op>add|mul|fma)_pred_on\.sum$")
#: Tensor-core operation metrics, with optional instruction, destination and sparsity qualifiers.
TENSOR_RE = re.compile(
    r"^sm(?:sp)?__ops_path_tensor(?:_op_(?P<op>[a-z0-9]+))?_src_(?P<src>[a-z0-9]+?)"
    r"(?:_dst_(?P<dst>[a-z0-9]+?))?(?:_sparsity_(?P<sparsity>on|off))?\.sum$"
)

#: Precision of each CUDA-core instruction prefix.
CUDA_CORE_PRECISION = {"f": "fp32", "d": "fp64", "h": "half"}
#: FLOPs per instruction of each operation, before half packing.
FLOPS_PER_INSTRUCTION = {"add": 1, "mul": 1, "fma": 2}
#: Tensor-core source types that are floating point (ops counted as FLOPs); anything else (int8, int4, b1) is not.
FLOAT_TENSOR_SOURCES = {"fp16": "fp16", "f16": "fp16", "hf": "fp16", "bf16": "bf16", "tf32": "tf32", "fp8": "fp8",
                        "e4m3": "fp8", "e5m2": "fp8", "fp64": "fp64", "dmma": "fp64", "fp32": "fp32"}

HALF_PACKING = {
    "pairs": "half instructions work on pairs (HADD2/HMUL2/HFMA2): 2·hadd + 2·hmul + 4·hfma, as nvprof's "
             "flop_count_hp",
    "single": "one value per half instruction: hadd + hmul + 2·hfma, as the achieved work of ncu's half roofline",
}

#: Metric patterns for ``ncu --metrics`` (ncu accepts ``regex:`` entries), so that the names of the installed ncu
#: version are picked up: every CUDA-core add/mul/fma per precision and every tensor-core source type.
NCU_METRIC_REGEXES = (
    r"regex:^sm__sass_thread_inst_executed_op_[dfh](add|mul|fma)_pred_on\.sum$",
    r"regex:^sm__ops_path_tensor_src_.*\.sum$",
)
#: The same metrics by name, for Hopper (gh100) as documented; printed with ``--explicit-metrics``.
NCU_METRIC_NAMES = tuple(
    f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in "fdh" for op in ("add", "mul", "fma")
) + tuple(
    f"sm__ops_path_tensor_src_{src}.sum" for src in ("fp16_dst_fp16", "fp16_dst_fp32", "bf16_dst_fp32", "tf32_dst_fp32",
                                                    "fp8", "fp64")
)


@dataclass(frozen=True)
class TensorMetric:
    """A tensor-core metric's qualifiers; ``None`` where the name does not narrow it (an aggregate over it)."""

    name: str
    src: str
    op: str | None
    dst: str | None
    sparsity: str | None

    def qualifiers(self) -> dict[str, str | None]:
        return {"op": self.op, "dst": self.dst, "sparsity": self.sparsity}

    def covers(self, other: "TensorMetric") -> bool:
        """True when ``self`` is an aggregate of ``other`` (or the same counter): every qualifier it fixes, other fixes
        the same way."""
        return self.src == other.src and all(
            v is None or v == other.qualifiers()[k] for k, v in self.qualifiers().items()
        )

    def overlaps(self, other: "TensorMetric") -> bool:
        """True when some operation could be counted by both (no qualifier fixed differently by the two)."""
        mine, theirs = self.qualifiers(), other.qualifiers()
        return self.src == other.src and not any(
            mine[k] is not None and theirs[k] is not None and mine[k] != theirs[k] for k in mine
        )


def parse_tensor_metric(name: str) -> TensorMetric | None:
    m = TENSOR_RE.match(name)
    if not m:
        return None
    return TensorMetric(name, m["src"], m["op"], m["dst"], m["sparsity"])


@dataclass(frozen=True)
class MetricPlan:
    """Which columns of an export count FLOPs and how; the others are listed with the reason they were left out."""

    cuda_core: Mapping[str, tuple[str, str]]  # metric → (precision, op)
    tensor: Mapping[str, str]  # metric → precision of its source type
    ignored: Mapping[str, str]  # metric → why it is not summed

    @property
    def used(self) -> tuple[str, ...]:
        return tuple(sorted(self.cuda_core)) + tuple(sorted(self.tensor))


def plan_metrics(names: Iterable[str]) -> MetricPlan:
    """Sort metric names into the CUDA-core and tensor-core counters summed as FLOPs and those left out.

    >>> plan = plan_metrics(["sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    ...                      "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum",
    ...                      "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "dram__bytes_read.sum"])
    >>> sorted(plan.tensor), sorted(plan.cuda_core)
    (['sm__ops_path_tensor_src_bf16_dst_fp32.sum'], ['sm__sass_thread_inst_executed_op_ffma_pred_on.sum'])
    >>> plan.ignored["sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum"]
    'part of sm__ops_path_tensor_src_bf16_dst_fp32.sum, which is summed instead'
    """
    cuda_core: dict[str, tuple[str, str]] = {}
    tensors: list[TensorMetric] = []
    ignored: dict[str, str] = {}
    for name in dict.fromkeys(names):
        m = CUDA_CORE_RE.match(name)
        if m:
            cuda_core[name] = (CUDA_CORE_PRECISION[m["p"]], m["op"])
            continue
        t = parse_tensor_metric(name)
        if t is None:
            ignored[name] = "not a floating-point operation counter"
        elif t.src not in FLOAT_TENSOR_SOURCES:
            ignored[name] = f"tensor-core source type {t.src} is integer work, not floating point"
        else:
            tensors.append(t)
    chosen: list[TensorMetric] = []
    # most aggregated first: fewest qualifiers fixed; a metric covered by a chosen one, or overlapping it, is left out
    for t in sorted(tensors, key=lambda t: (sum(v is not None for v in t.qualifiers().values()), t.name)):
        holder = next((c for c in chosen if c.covers(t)), None)
        if holder is not None:
            ignored[t.name] = f"part of {holder.name}, which is summed instead"
            continue
        clash = next((c for c in chosen if c.overlaps(t)), None)
        if clash is not None:
            ignored[t.name] = f"overlaps {clash.name} (both may count the same operations); that one is summed"
            continue
        chosen.append(t)
    return MetricPlan(cuda_core, {t.name: FLOAT_TENSOR_SOURCES[t.src] for t in chosen}, ignored)


@dataclass(frozen=True)
class KernelFlops:
    """One kernel launch as the export lists it, and its FLOPs per precision and unit."""

    id: str
    name: str
    nvtx: str  # the NVTX ranges open at launch, outermost first, joined by " > " ("" without --nvtx)
    cuda_core: Mapping[str, int]  # precision → FLOPs
    tensor_core: Mapping[str, int]  # precision of the source type → FLOPs (ops)

    @property
    def flops(self) -> int:
        return sum(self.cuda_core.values()) + sum(self.tensor_core.values())


@dataclass(frozen=True)
class NcuExport:
    """A parsed export: kernel launches in order and how their counters were read."""

    path: str
    layout: str  # "raw" or "details"
    kernels: tuple[KernelFlops, ...]
    plan: MetricPlan
    half_packing: str
    version: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def conventions(self) -> dict[str, str]:
        return {
            "fma": "one FMA instruction per thread = 2 FLOPs; add and mul = 1",
            "half_packing": f"{self.half_packing}: {HALF_PACKING[self.half_packing]}",
            "tensor_core": "one tensor-core operation = 1 FLOP (a multiply-accumulate = 2)",
            "aggregates": "an aggregate metric is never added to its own parts (see metrics_ignored)",
        }


# ---------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_COUNT_UNIT = re.compile(r"^(?P<prefix>[KMGT]?)(?P<unit>inst|op|ops|flop|warp|thread|sector|request)s?$")
_NVTX_HEADER = re.compile(r"nvtx|push/pop|range", re.IGNORECASE)
_VERSION = re.compile(r"(?:Nsight Compute|NVIDIA \(R\) Nsight Compute Command Line Profiler).*?(\d{4}\.\d+(?:\.\d+)*)")


def _scale(unit: str, where: str) -> int:
    unit = unit.strip()
    if not unit:
        return 1
    m = _COUNT_UNIT.match(unit)
    if m is None:
        raise MeasurementError(f"{where}: unit {unit!r} is not a count; export with --print-units base")
    return _SCALE[m["prefix"]]


def _number(text: str, unit_scale: int, where: str) -> int | None:
    """A count from a CSV cell: thousands separators stripped, ``n/a`` (not collected for this kernel) → None."""
    cell = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if cell.lower() in ("", "n/a", "na", "(!)n/a", "-"):
        return None
    try:
        value = float(cell)
    except ValueError:
        raise MeasurementError(f"{where}: {text!r} is not a number") from None
    if value < 0 or value != value:
        raise MeasurementError(f"{where}: {text!r} is not a valid count")
    return round(value * unit_scale)


def _kernel_flops(id_: str, name: str, nvtx: str, values: Mapping[str, int | None], plan: MetricPlan,
                  half_packing: str) -> KernelFlops:
    cuda: dict[str, int] = {}
    for metric, (precision, op) in plan.cuda_core.items():
        v = values.get(metric)
        if v is None:
            continue
        factor = FLOPS_PER_INSTRUCTION[op] * (2 if precision == "half" and half_packing == "pairs" else 1)
        cuda[precision] = cuda.get(precision, 0) + factor * v
    tensor: dict[str, int] = {}
    for metric, precision in plan.tensor.items():
        v = values.get(metric)
        if v is not None:
            tensor[precision] = tensor.get(precision, 0) + v
    # precisions whose counters all read 0 are left out (the counters were read: 0 is a measurement, kept in total)
    return KernelFlops(id_, name, nvtx, {p: v for p, v in cuda.items() if v}, {p: v for p, v in tensor.items() if v})


def _find_header(lines: list[str], path: str) -> int:
    for i, line in enumerate(lines):
        if line.lstrip().startswith('"ID"') or line.lstrip().startswith("ID,"):
            return i
    raise MeasurementError(
        f"{path}: not an ncu CSV export (no header row starting with \"ID\"); export it with "
        "ncu --csv --page raw --print-units base (or ncu --import FILE.ncu-rep --csv --page raw --print-units base)"
    )


def parse_ncu_csv(text: str, path: str = "<ncu export>", half_packing: str = "pairs") -> NcuExport:
    """Parse an ncu CSV export in either layout into per-kernel FLOPs.

    The raw page (``--page raw``) has one row per kernel and one column per metric, the units in the row under the
    header. The details page (``--page details``, ncu's default) has one row per metric with ``Metric Name``,
    ``Metric Unit`` and ``Metric Value``. Lines before the header (``==PROF==`` messages) are skipped; thousands
    separators are stripped; ``n/a`` cells are counters not collected for that kernel.
    """
    if half_packing not in HALF_PACKING:
        raise MeasurementError(f"half packing must be one of {', '.join(HALF_PACKING)}, got {half_packing!r}")
    lines = text.splitlines()
    start = _find_header(lines, path)
    version = next((m.group(1) for line in lines[:start] if (m := _VERSION.search(line))), None)
    # ncu's own messages (==PROF==, ==WARNING==) may be interleaved with the rows when --log-file holds both
    lines = lines[:start + 1] + ["" if line.startswith("==") else line for line in lines[start + 1:]]
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = [h.strip() for h in rows[0]]
    if "Kernel Name" not in header:
        raise MeasurementError(f"{path}: the header has no \"Kernel Name\" column; is this an ncu kernel export?")
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_details(header, rows[1:], path, half_packing, version, start)
    return _parse_raw(header, rows[1:], path, half_packing, version, start)


#: One range of an NVTX cell: ``"<domain>:<range name>:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"``, the six
#: trailing fields ``none`` for a plain string range (what ``torch.cuda.nvtx`` pushes). The range name may itself hold
#: colons (``aten::addmm``), so it is what lies between the domain and the last six fields.
_NVTX_ENTRY = re.compile(r'"([^"]*)"')
_NVTX_TRAILING_FIELDS = 6


def _range_name(entry: str) -> str:
    """The range name of one NVTX entry (domain, an optional start/stop id and the six trailing fields removed)."""
    fields = entry.split(":")
    if len(fields) < 2 + _NVTX_TRAILING_FIELDS:
        return entry.strip()
    body = fields[:-_NVTX_TRAILING_FIELDS]
    if body[0].strip().isdigit() and len(body) > 2:  # a start/stop range: "<id>:<domain>:<name>"
        body = body[1:]
    return ":".join(body[1:]).strip()


def nvtx_ranges(cell: str) -> list[str]:
    """The range names of one NVTX cell of an ncu export, outermost first.

    ncu writes the push/pop ranges open on the launching thread as the thread id followed by one quoted entry per
    range, and the start/stop (process) ranges likewise with an id in each entry; a cell in any other layout (an
    older ncu, a hand-made export) is read as one entry, or kept whole when it has not the entry's fields.

    >>> nvtx_ranges('7  "<default domain>:flopcount/forward:none:none:none:none:none:none"  '
    ...             '"<default domain>:aten::addmm, seq = 3, op_id = 9:none:none:none:none:none:none" ')
    ['flopcount/forward', 'aten::addmm, seq = 3, op_id = 9']
    >>> nvtx_ranges('"2:<default domain>:flopcount/backward:none:none:none:none:none:none"')
    ['flopcount/backward']
    """
    entries = _NVTX_ENTRY.findall(cell) or [cell]
    return [name for name in map(_range_name, entries) if name]


def _nvtx_text(header: list[str], row: list[str]) -> str:
    """The NVTX ranges open at a kernel's launch, process (start/stop) ranges first, then the launching thread's
    push/pop stack, outermost first, joined by `` > ``."""
    cols = [i for i, h in enumerate(header) if i < len(row) and _NVTX_HEADER.search(h) and row[i].strip()]
    cols.sort(key=lambda i: 0 if "start/stop" in header[i].lower() else 1)
    return " > ".join(name for i in cols for name in nvtx_ranges(row[i]))


def _data_rows(rows, width: int, path: str, first_line: int):
    """``(where, row)`` for each non-blank row, ``where`` naming its line; a row shorter than the header is an
    error."""
    for n, row in enumerate(rows):
        if not any(c.strip() for c in row):
            continue
        where = f"{path}: line {first_line + n}"
        if len(row) < width:
            raise MeasurementError(f"{where}: {len(row)} cells for {width} columns (a truncated export?)")
        yield where, row


def _parse_raw(header, rows, path, half_packing, version, offset) -> NcuExport:
    plan = plan_metrics(h for h in header if "__" in h)
    if not plan.used:
        raise MeasurementError(
            f"{path}: no floating-point counter among its {len(header)} columns; profile with the metrics of "
            "flopcount crosscheck --print-ncu-command"
        )
    if not rows:
        raise MeasurementError(f"{path}: no kernel rows under the header; did the profiled range launch any kernel?")
    units = rows[0]
    if len(units) == len(header) and units[header.index("ID")].strip() == "" and any(u.strip() for u in units):
        rows = rows[1:]
        line_of_first = offset + 3
    else:  # exported without the unit row
        units = [""] * len(header)
        line_of_first = offset + 2
    col = {h: i for i, h in enumerate(header)}
    scales = {m: _scale(units[col[m]] if col[m] < len(units) else "", f"{path}: column {m}") for m in plan.used}
    kernels = []
    for where, row in _data_rows(rows, len(header), path, line_of_first):
        values = {m: _number(row[col[m]], scales[m], f"{where}, column {m}") for m in plan.used}
        kernels.append(_kernel_flops(row[col["ID"]].strip(), row[col["Kernel Name"]].strip(), _nvtx_text(header, row),
                                     values, plan, half_packing))
    return NcuExport(path, "raw", tuple(kernels), plan, half_packing, version)


def _parse_details(header, rows, path, half_packing, version, offset) -> NcuExport:
    col = {h: i for i, h in enumerate(header)}
    names = [r[col["Metric Name"]].strip() for r in rows if len(r) > col["Metric Name"]]
    plan = plan_metrics(n for n in names if "__" in n)
    if not plan.used:
        raise MeasurementError(
            f"{path}: no floating-point counter among its metric rows; profile with the metrics of "
            "flopcount crosscheck --print-ncu-command"
        )
    per_kernel: dict[tuple[str, str], dict] = {}
    for where, row in _data_rows(rows, len(header), path, offset + 2):
        key = (row[col.get("Process ID", col["ID"])].strip(), row[col["ID"]].strip())
        entry = per_kernel.setdefault(key, {"name": row[col["Kernel Name"]].strip(), "nvtx": _nvtx_text(header, row),
                                            "values": {}})
        metric = row[col["Metric Name"]].strip()
        if metric in plan.used:
            unit = row[col["Metric Unit"]] if "Metric Unit" in col else ""
            value = _number(row[col["Metric Value"]], _scale(unit, f"{where}, {metric}"), f"{where}, {metric}")
            entry["values"][metric] = value
    if not per_kernel:
        raise MeasurementError(f"{path}: no metric rows under the header; did the profiled range launch any kernel?")
    kernels = tuple(_kernel_flops(k[1], e["name"], e["nvtx"], e["values"], plan, half_packing)
                    for k, e in per_kernel.items())
    return NcuExport(path, "details", kernels, plan, half_packing, version)


def read_ncu_csv(path: str, half_packing: str = "pairs") -> NcuExport:
    """:func:`parse_ncu_csv` of a file; an unreadable file is a :class:`MeasurementError` naming it."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise MeasurementError(f"{path}: cannot read the ncu export ({e.strerror})") from None
    return parse_ncu_csv(text, path, half_packing)


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------


def ncu_command(driver: list[str], output: str = "step.csv", explicit_metrics: bool = False,
                ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles ``driver`` (a command that brackets one steady-state step with
    ``cudaProfilerStart``/``Stop``) and writes the per-kernel CSV to ``output``."""
    metrics = ",".join(NCU_METRIC_NAMES if explicit_metrics else NCU_METRIC_REGEXES)
    return [ncu, "--profile-from-start", "off", "--target-processes", "all", "--nvtx", "--metrics", metrics,
            "--csv", "--page", "raw", "--print-units", "base", "--log-file", output, *driver]
