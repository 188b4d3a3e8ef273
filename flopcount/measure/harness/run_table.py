"""Text tables of runs and benchmark reports (the CLI prints them; the meter's ``summary()`` returns one)."""

from __future__ import annotations

from typing import Any, Mapping

from tabulate import tabulate

from .result import RunResult


def si(value: float | None, unit: str = "") -> str:
    """``1.23 GFLOP/s``-style text; ``None`` is "n/a"."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2%}"


def run_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    sps = run["samples_per_s"]
    rows = [
        ("samples (timed)", f"{run['samples']:,} ({run['timed_samples']:,} in {sps['windows']} windows)"),
        ("ranks", str(run["ranks"])),
        ("step time (median)", "n/a" if run["step_time_s"] is None else f"{run['step_time_s'] * 1e3:.3f} ms"),
        ("samples/s per rank (median)", si(sps["per_rank"])),
        ("samples/s total (median) / end to end", f"{si(sps['total'])} / {si(sps.get('end_to_end'))}"),
        ("window spread (min..max, std/mean)",
         "n/a" if sps["min"] is None else f"{si(sps['min'])}..{si(sps['max'])}, "
         + ("n/a" if sps["variation"] is None else f"{sps['variation']:.1%}")),
        ("training FLOPs per sample (C)", si(run["flops_per_sample"], "FLOP")),
    ]
    if run.get("tokens_per_s"):
        rows += [("tokens/s per rank (median) / total", f"{si(run['tokens_per_s']['per_rank'])} / "
                  f"{si(run['tokens_per_s']['total'])}"),
                 ("training FLOPs per token", si(run.get("flops_per_token"), "FLOP"))]
    rows += [
        ("FLOPS = N x R x C", si(run["flops"], "FLOP/s")),
        ("precision", str(run["precision"])),
        ("peak (one device)", si(run["peak_flops"], "FLOP/s")),
        ("MFU", _pct(run["mfu"])),
        ("HFU", _pct(run["hfu"])),
        ("quality / target", f"{_num(run['quality'])} / {_num(run['target_quality'])}"),
        ("VFLOPS", si(run["vflops"], "FLOP/s")),
        ("time to quality", "n/a" if run["time_to_quality_s"] is None else f"{run['time_to_quality_s']:.3f} s"),
        ("wall time", "n/a" if run["wall_s"] is None else f"{run['wall_s']:.3f} s"),
        ("FLOPS (HPC AI500 V3.0 epoch form)", si(run["flops_epoch_form"], "FLOP/s")),
        ("energy", si(run["energy_j"], "J")),
        ("average power", si(run["power_w"], "W")),
        ("FLOPS per watt", si(run["flops_per_watt"], "FLOP/s/W")),
        ("VFLOPS per watt", si(run["vflops_per_watt"], "FLOP/s/W")),
    ]
    return rows + scale_out_rows(run)


def scale_out_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows of a run on several ranks: the slowest rank, the gradient all-reduce and the ensemble."""
    rows = []
    sps = run["samples_per_s"]
    if sps.get("slowest_rank") is not None:
        rows.append(("slowest rank, imbalance", f"{si(sps['slowest_rank'])} samples/s, "
                     + ("n/a" if sps.get("imbalance") is None else f"{sps['imbalance']:.1%}")))
    comm = run.get("communication")
    if comm:
        rows += [("all-reduce bytes per step (measured)", si(comm["bytes_per_step"], "B")),
                 ("ring all-reduce bytes sent per step", si(comm["bytes_per_step_ring"], "B")),
                 ("COI (FLOPs per byte all-reduced)", _num(comm["coi"]))]
    ens = run.get("ensemble")
    if ens:
        rows += [("ensemble", f"{ens['models']} base models x {ens['ranks_per_model']} rank(s)"),
                 ("base models' quality", ", ".join(_num(b["quality"]) for b in ens["base_models"])),
                 ("APC (FLOPs per iteration)", si(ens["apc"], "FLOP"))]
    return rows


def parallel_lines(run: Mapping[str, Any]) -> list[str]:
    """Under a parallel plan: every rank's MFU and HFU, the slowest rank and the imbalance, and the conventions of
    other tools from the same run (none without a plan)."""
    par = run.get("parallel")
    if not par:
        return []
    rows = [[r["rank"], ",".join(f"{k}{v}" for k, v in r["coords"].items()), si(r["model_flops"], "FLOP"),
             si(r["hardware_flops"], "FLOP"),
             "n/a" if r["step_time_s"] is None else f"{r['step_time_s'] * 1e3:.3f} ms", _pct(r["mfu"]),
             _pct(r["hfu"])] for r in par["ranks"]]
    plan = par["plan"]
    out = ["", f"MFU per rank, plan {', '.join(f'{k}={plan[k]}' for k in ('tp', 'pp', 'cp', 'ep', 'dp'))}, "
           f"{plan['microbatches']} microbatch(es) per step; rank order {par['rank_order']}:",
           tabulate(rows, headers=["rank", "coords", "model FLOPs/step", "hardware FLOPs/step", "step time", "MFU",
                                   "HFU"], disable_numparse=True),
           "slowest rank: " + ("n/a" if par["slowest_rank"] is None else
                               f"{par['slowest_rank']}, imbalance {par['imbalance']:.3f} ({par['imbalance_how']})")]
    conv = [[name, si(c["flops_per_s_per_device"], "FLOP/s"), _pct(c["mfu"]), c["formula"]]
            for name, c in par["conventions"].items()]
    out += ["conventions from the same run (W: whole-model FLOPs of one microbatch, t: the slowest rank's step):",
            tabulate(conv, headers=["convention", "per device", "MFU", "formula"], disable_numparse=True)]
    out += [f"n/a {name}: {c['unavailable']}" for name, c in par["conventions"].items() if c["unavailable"]]
    out += [f"n/a parallel.{k}: {why}" for k, why in par["unavailable"].items()]
    return out


def prediction_lines(run: Mapping[str, Any]) -> list[str]:
    """With a machine profile: the step predicted beside the measured one and their relative error, then the
    prediction's own lines' notes (none without a profile, or when the count could not be predicted)."""
    pred = run.get("prediction")
    if not pred or pred.get("predicted_step_s") is None:
        return []
    low, high = ("not known" if v is None else f"{v * 1e3:.3f}" for v in pred["interval"])
    err = "n/a" if pred["relative_error"] is None else f"{pred['relative_error']:+.1%}"
    measured = "n/a" if pred["measured_step_s"] is None else f"{pred['measured_step_s'] * 1e3:.3f} ms"
    prof = pred["prediction"]["profile"]
    out = ["", f"step predicted {pred['predicted_step_s'] * 1e3:.3f} ms [{low}, {high}] on the {prof['device']} "
           f"profile, measured {measured} (the slowest rank's median): error {err}"]
    return out + [f"prediction: {n}" for n in (*pred["notes"], *pred["prediction"]["notes"])]


def run_table(run: RunResult | Mapping[str, Any]) -> str:
    d = run.as_dict() if isinstance(run, RunResult) else run
    text = tabulate(run_rows(d), tablefmt="simple", disable_numparse=True)
    lines = [text, *parallel_lines(d), *prediction_lines(d), "", f"peak: {d['peak_source']}"]
    lines += [f"note: {n}" for n in d.get("notes") or ()]
    for key, why in d["unavailable"].items():
        lines.append(f"n/a {key}: {why}")
    return "\n".join(lines) + "\n"


def report_table(doc: Mapping[str, Any]) -> str:
    """The runs of a benchmark report side by side, then the summary."""
    runs = doc["runs"]
    keys = ("samples_per_s", "flops", "mfu", "quality", "vflops", "time_to_quality_s", "wall_s", "energy_j")
    rows = []
    for i, r in enumerate(runs):
        sps = r["samples_per_s"]
        rows.append([i, si(sps["total"]), si(sps.get("end_to_end")), si(r["flops"], "FLOP/s"), _pct(r["mfu"]),
                     "n/a" if r["quality"] is None else f"{r['quality']:.4f}", si(r["vflops"], "FLOP/s"),
                     "n/a" if r["time_to_quality_s"] is None else f"{r['time_to_quality_s']:.2f} s",
                     "n/a" if r["wall_s"] is None else f"{r['wall_s']:.2f} s", si(r["energy_j"], "J")])
    s = doc["summary"]
    headers = ["run", "samples/s (median)", "end to end", "FLOPS", "MFU", "quality", "VFLOPS", "time to quality",
               "wall", "energy"]
    out = [tabulate(rows, headers=headers, disable_numparse=True), ""]
    if s is not None:
        out.append(f"summary over {s['runs']} runs ({s['kept_runs']} kept; {s['rule']}):")
        srows = []
        for k in keys:
            mean, var = s["mean"].get(k), s["variation"].get(k)
            srows.append([k, "n/a" if mean is None else f"{mean:.6g}", "n/a" if var is None else f"{var:.2%}"])
        out.append(tabulate(srows, headers=["score", "mean", "variation"], disable_numparse=True))
    cut = doc.get("interrupted")
    if cut:
        out.append(f"incomplete: {cut['signal']} during run {cut['run']} (after {cut['steps']} steps)")
    first = runs[0] if runs else None
    if first is not None and scale_out_rows(first):
        out += ["", f"run 0 on {first['ranks']} ranks:",
                tabulate(scale_out_rows(first), tablefmt="simple", disable_numparse=True)]
    if first is not None:
        out += parallel_lines(first)
        for i, r in enumerate(runs):
            out += [line.replace("step predicted", f"run {i}: step predicted") for line in prediction_lines(r)]
        out.append("")
        out.append(f"peak: {first['peak_source']}")
    for i, r in enumerate(runs):
        out += [f"note (run {i}): {n}" for n in r.get("notes") or ()]
    if first is not None:
        for key, why in first["unavailable"].items():
            out.append(f"n/a {key}: {why}")
    return "\n".join(out) + "\n"
