"""Rooflines: the HPC AI500 V2.0 §6.4 case study's arithmetic and bound decisions, run files, and the plots
(rendered to files, opened as images, their ceilings counted from the figure's artists)."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main
from flopcount.errors import MeasurementError
from flopcount.measure.machine.ceilings import Ceilings, Figure, ceilings_from_dict
from flopcount.measure.profile.roofline import (Ceiling, Point, Roofline, hpcai_roofline, operator_roofline, plot_op_types,
                                        plot_roofline, run_points)

T, G = 1e12, 1e9

# HPC AI500 V2.0 §6.4: one node of 8 V100 (NVLink 300 GB/s, HBM 1134 GB/s) and the 8-node system (10 Gb/s
# Ethernet, 1.2 GB/s measured), ceilings in TFLOPS as the paper gives them.
SINGLE = Roofline(
    "single node",
    (Ceiling("peak mixed", 1040 * T), Ceiling("GEMM mixed", 636 * T), Ceiling("CONV mixed", 176 * T),
     Ceiling("GEMM fp32", 115 * T), Ceiling("CONV fp32", 112 * T)),
    (Ceiling("NVLink", 300 * G), Ceiling("memory", 1134 * G)),
    "COI", "communication")
DISTRIBUTED = Roofline(
    "distributed",
    (Ceiling("peak mixed", 8320 * T), Ceiling("GEMM mixed", 5091 * T), Ceiling("CONV mixed", 2376 * T),
     Ceiling("CONV fp32", 976 * T), Ceiling("GEMM fp32", 920 * T)),
    (Ceiling("network", 1.2 * G), Ceiling("NVLink", 300 * G)),
    "COI", "communication")


@pytest.mark.parametrize("roof, compute, bandwidth, ridge", [
    pytest.param(SINGLE, "GEMM fp32", "NVLink", 115e12 / 300e9, id="single-gemm-fp32-nvlink"),      # 383.3
    pytest.param(SINGLE, "peak mixed", "NVLink", 1040e12 / 300e9, id="single-peak-nvlink"),         # 3,466.7
    pytest.param(SINGLE, "GEMM mixed", "memory", 636e12 / 1134e9, id="single-gemm-mixed-memory"),   # 560.8
    pytest.param(DISTRIBUTED, "GEMM fp32", "network", 920e12 / 1.2e9, id="dist-gemm-fp32-network"),  # 766,666.7
    pytest.param(DISTRIBUTED, "peak mixed", "network", 8320e12 / 1.2e9, id="dist-peak-network"),    # 6,933,333
])
def test_case_study_ridge_points(roof, compute, bandwidth, ridge):
    assert roof.ridge(compute, bandwidth) == pytest.approx(ridge)


@pytest.mark.parametrize("roof, coi, compute, bandwidth, attained, bound", [
    # 300 GB/s x 1000 FLOP/B = 300 TFLOPS, above fp32 GEMM's 115: compute-bound at 115
    pytest.param(SINGLE, 1000, "GEMM fp32", "NVLink", 115e12, "compute", id="single-fp32-compute-bound"),
    # the same run against mixed GEMM (636 TFLOPS): the 300 TFLOPS link roof binds
    pytest.param(SINGLE, 1000, "GEMM mixed", "NVLink", 300e12, "communication", id="single-mixed-comm-bound"),
    # 1134 GB/s x 100 = 113.4 TFLOPS < 115: memory roof binds just below fp32 GEMM
    pytest.param(SINGLE, 100, "GEMM fp32", "memory", 113.4e12, "communication", id="single-memory-roof"),
    # 1.2 GB/s x 1e5 = 120 TFLOPS, far below the 920 TFLOPS fp32 GEMM of 8 nodes
    pytest.param(DISTRIBUTED, 1e5, "GEMM fp32", "network", 120e12, "communication", id="dist-network-bound"),
    # 1.2 GB/s x 1e6 = 1,200 TFLOPS > 976 TFLOPS fp32 CONV: compute-bound
    pytest.param(DISTRIBUTED, 1e6, "CONV fp32", "network", 976e12, "compute", id="dist-conv-compute-bound"),
    # by default the highest compute ceiling and the first bandwidth (the network): min(8320, 1.2 x 1e4 = 12) TFLOPS
    pytest.param(DISTRIBUTED, 1e4, None, None, 12e12, "communication", id="dist-default-network"),
])
def test_case_study_attained_and_bound(roof, coi, compute, bandwidth, attained, bound):
    assert roof.attained(coi, compute, bandwidth) == pytest.approx(attained)
    assert roof.bound(coi, compute, bandwidth) == bound


def _ceilings(nodes=1, ranks=1, allreduce=None, memory=1134 * G, peak=None) -> Ceilings:
    device = {"kind": "cuda", "name": "Tesla V100-SXM3", "peaks": {} if peak is None else
              {"fp16": {"flops_per_s": peak, "source": "datasheet"}}}
    return Ceilings(device, {"fp32": Figure(115 * T / 8, "gemm"), "fp16": Figure(636 * T / 8, "gemm")},
                    {"fp32": Figure(112 * T / 8, "conv"), "fp16": Figure(176 * T / 8, "conv")},
                    Figure(memory, "copy"), None if allreduce is None else Figure(allreduce, "all-reduce"),
                    nodes, ranks)


def test_hpcai_roofline_scales_per_device_ceilings_by_ranks():
    # per V100: fp32 GEMM 115/8 = 14.375 TFLOPS, peak 130 TFLOPS; 64 ranks on 8 nodes: 920 and 8,320 TFLOPS
    roof = hpcai_roofline(_ceilings(nodes=8, ranks=64, allreduce=1.2 * G, peak=130 * T), ranks=64, nodes=8)
    values = {c.label: c.value for c in roof.compute}
    assert values["GEMM fp32"] == pytest.approx(920 * T)
    assert values["peak mixed fp16"] == pytest.approx(8320 * T)
    assert [c.label for c in roof.bandwidth] == ["network (all-reduce)"]
    assert roof.bound(1e5) == "communication" and roof.attained(1e5) == pytest.approx(1.2e9 * 1e5)


def test_single_node_roofline_has_link_and_memory():
    roof = hpcai_roofline(_ceilings(ranks=8, allreduce=300 * G), ranks=8, nodes=1)
    assert [c.label for c in roof.bandwidth] == ["intra-node link (all-reduce)", "memory"]
    assert {c.label: c.value for c in roof.compute}["CONV fp32"] == pytest.approx(112 * T)


def _cpu_ceilings(threads, cores=2, ranks=1):
    # a CPU whose GEMM ceiling was measured on ``threads`` torch threads: 100 GFLOP/s, convolution 80 GFLOP/s
    device = {"kind": "cpu", "name": "a CPU", "peaks": {}, "details": {"cores": cores}}
    return Ceilings(device, {"fp32": Figure(100 * G, "gemm", {"threads": threads})},
                    {"fp32": Figure(80 * G, "conv", {"threads": threads})}, Figure(20 * G, "copy"), None, 1, ranks)


@pytest.mark.parametrize("measured, ranks, threads, cores, factor", [
    (2, 2, 1, 2, 1.0),      # two ranks of one thread on the two cores that measured it: the ceiling once
    (1, 2, 1, 2, 2.0),      # measured per rank (torchrun's one thread): x 2 ranks
    (2, 1, 1, 2, 0.5),      # one rank of one thread uses half of what two threads measured
    (1, 4, 2, 4, 4.0),      # 4 ranks x 2 threads = 8 threads, but the node has 4 cores: 4/1
    (4, 8, 1, 4, 2.0),      # 2 nodes x 4 cores (see nodes below): 8 ranks of one thread, 4 measured it
])
def test_cpu_ceilings_scale_with_the_threads_the_run_used(measured, ranks, threads, cores, factor):
    nodes = 2 if ranks == 8 else 1
    c = _cpu_ceilings(measured, cores)
    roof = hpcai_roofline(Ceilings(c.device, c.gemm, c.conv, c.memory_bandwidth, Figure(5 * G, "all-reduce"),
                                   nodes, ranks), ranks=ranks, nodes=nodes, threads=threads)
    values = {ce.label: ce.value for ce in roof.compute}
    assert values["GEMM fp32"] == pytest.approx(100 * G * factor)
    assert values["CONV fp32"] == pytest.approx(80 * G * factor)


def test_cpu_run_without_its_threads_is_scaled_by_ranks_and_says_so():
    roof = hpcai_roofline(_cpu_ceilings(1, ranks=2), ranks=2, nodes=1, threads=None)
    gemm = next(c for c in roof.compute if c.label == "GEMM fp32")
    assert gemm.value == pytest.approx(200 * G)
    assert "assuming each rank ran the 1 thread of this measurement (the run does not record" in gemm.source
    old = _cpu_ceilings(None, ranks=2)  # a ceilings file written before conv and GEMM recorded their threads
    gemm = next(c for c in hpcai_roofline(old, ranks=2, nodes=1, threads=1).compute if c.label == "GEMM fp32")
    assert gemm.value == pytest.approx(200 * G) and "(the ceiling does not record its threads)" in gemm.source


def test_run_points_read_the_threads_per_rank():
    doc = _bench([{"flops": 2.0e9, "communication": {"coi": 800.0}}])
    assert run_points(doc)[0].threads is None
    doc["system"]["cpu"] = {"torch_threads": 3}
    assert run_points(doc)[0].threads == 3


def _bench(runs, ranks=2, nodes=1):
    return {"schema_version": 1, "tool": {"name": "flopcount"}, "system": {"nodes": nodes, "ranks": ranks,
                                                                           "device": {"kind": "cpu"}},
            "config": {}, "runs": runs, "summary": {}}


def test_run_points_read_coi_and_skip_runs_without_it():
    doc = _bench([
        {"flops": 2.0e9, "communication": {"bytes_per_step": 1e6, "bytes_per_step_ring": 1e6, "coi": 800.0}},
        {"flops": 2.1e9, "communication": None, "unavailable": {"communication": "one rank"}},
    ])
    points = run_points(doc)
    assert [(p.flops, p.coi, p.ranks) for p in points] == [(2.0e9, 800.0, 2)]


def test_run_without_communication_is_a_clear_error():
    doc = _bench([{"flops": 2.0e9, "communication": {"coi": None},
                   "unavailable": {"communication": "a single rank: nothing is communicated"}}], ranks=1)
    with pytest.raises(MeasurementError, match="a single rank: nothing is communicated.*torchrun"):
        run_points(doc, "run.json")


def test_cli_hpcai_roofline_text_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    c = _ceilings(ranks=2, allreduce=2 * G, memory=10 * G).as_dict()
    (tmp_path / "c.json").write_text(json.dumps(c))
    # COI 800 FLOP/B: link roof 2 GB/s x 800 = 1.6 TFLOPS, below every compute ceiling x 2 ranks (>= 28 TFLOPS)
    (tmp_path / "run.json").write_text(json.dumps(_bench([{"flops": 1.0e12, "communication": {"coi": 800.0}}])))
    rc = main(["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(tmp_path / "run.json"),
               "--plot", str(tmp_path / "r.svg"), "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    point = doc["points"][0]
    assert point["bound"] == "communication"
    assert point["attainable_flops_per_s"] == pytest.approx(2e9 * 800)  # the all-reduce link: 2 GB/s x 800
    assert 'id="ceiling:' in (tmp_path / "r.svg").read_text()


def test_a_run_above_its_compute_ceiling_shows_the_ceilings_stale(tmp_path, capsys):
    """A run of 1 PFLOP/s over 2 ranks against ceilings whose highest compute roof, scaled to them, is far below:
    one line saying the ceilings are stale, in the text and the JSON; the run of the test above (1 TFLOP/s) none."""
    c = _ceilings(ranks=2, allreduce=2 * G, memory=10 * G)
    (tmp_path / "c.json").write_text(json.dumps(c.as_dict()))
    (tmp_path / "run.json").write_text(json.dumps(_bench([{"flops": 1.0e15, "communication": {"coi": 800.0}}])))
    args = ["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(tmp_path / "run.json")]
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    roof = max(c["flops_per_s"] for c in doc["compute"] if c["label"] == doc["points"][0]["compute_ceiling"])
    assert roof < 1e15  # the compute roof the run is judged against
    (note,) = doc["notes"]
    assert "ran at 1e+06 GFLOP/s, above the ceiling of" in note and "stale" in note and "\n" not in note
    assert main(args) == 0
    assert "Note: " + note in capsys.readouterr().out
    (tmp_path / "run.json").write_text(json.dumps(_bench([{"flops": 1.0e12, "communication": {"coi": 800.0}}])))
    assert main([*args, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []


def test_cli_run_without_coi_exits_12(tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps(_ceilings().as_dict()))
    (tmp_path / "run.json").write_text(json.dumps(_bench([{"flops": 1.0e9}], ranks=1)))
    rc = main(["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(tmp_path / "run.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 12 and len(err) == 1 and "communication" in err[0] and "run.json" in err[0]


def test_ceilings_file_round_trip_and_bad_file(tmp_path, capsys):
    c = _ceilings(nodes=2, ranks=16, allreduce=1.2 * G)
    assert ceilings_from_dict(json.loads(c.to_json())) == c
    (tmp_path / "bad.json").write_text('{"gemm": {"fp32": {"flops_per_s": -1}}, "schema_version": 1}')
    (tmp_path / "run.json").write_text("{}")
    rc = main(["roofline", "--ceilings", str(tmp_path / "bad.json"), "--run", str(tmp_path / "run.json")])
    assert rc == 12 and "gemm.fp32" in capsys.readouterr().err


def _count_ceilings(fig) -> int:
    return sum(1 for line in fig.axes[0].lines if (line.get_gid() or "").startswith("ceiling:"))


@pytest.mark.parametrize("roof, n", [pytest.param(SINGLE, 7, id="single-5-compute-2-bandwidth"),
                                     pytest.param(DISTRIBUTED, 7, id="distributed")])
def test_plot_roofline_png(tmp_path, roof, n):
    image = pytest.importorskip("matplotlib.image")
    path = str(tmp_path / "roof.png")
    fig = plot_roofline(roof, [Point("run", 1000.0, 200e12), Point("model", 50.0, None)], path)
    assert _count_ceilings(fig) == n
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = {t.get_text() for t in ax.texts}
    assert "GEMM fp32 115.00 TFLOP/s" in labels or "GEMM fp32 920.00 TFLOP/s" in labels
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300


@pytest.mark.slow
def test_operator_roofline_plot_of_a_count(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    import onnx

    import flopcount
    from flopcount.measure.profile.roofline import report_points

    report = flopcount.count("examples/resnet50-v1.5.onnx")
    roof = operator_roofline(_ceilings())
    points = report_points(report)
    fig = plot_roofline(roof, points, str(tmp_path / "ops.png"))
    assert _count_ceilings(fig) == 4 + 1  # GEMM and CONV in fp32 and fp16, memory
    assert image.imread(str(tmp_path / "ops.png")).ndim == 3
    # FLOPs by op type: one bar per op type with FLOPs (every one in ResNet-50 but Reshape)
    graph = onnx.load("examples/resnet50-v1.5.onnx", load_external_data=False).graph
    fig = plot_op_types(report, str(tmp_path / "types.png"))
    assert len(fig.axes[0].patches) == len({n.op_type for n in graph.node} - {"Reshape"}) == 7
    assert image.imread(str(tmp_path / "types.png")).ndim == 3


def test_cli_plot_option_and_missing_matplotlib(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    assert main(["examples/resnet50-v1.5.onnx", "--plot", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert main(["examples/resnet50-v1.5.onnx", "--plot", str(tmp_path / "t.txt")]) == 2
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    capsys.readouterr()
    assert main(["examples/resnet50-v1.5.onnx", "--plot", str(tmp_path / "u.png")]) == 11
    assert "pip install matplotlib" in capsys.readouterr().err


def test_cli_operator_roofline_of_a_model_with_input_shape_or_torch(tmp_path, monkeypatch, capsys):
    """A model's per-operator roofline takes --input-shape (here the batch of x) or a --torch module; a product
    x[B,91]·W[91,23] sits at 2·B·91·23 FLOPs over 4·(B·91 + 91·23 + B·23) bytes."""
    import onnx
    from onnx import TensorProto, helper

    def intensity(b):
        return 2 * b * 91 * 23 / (4 * (b * 91 + 91 * 23 + b * 23))

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 91]),
                               helper.make_tensor_value_info("W", TensorProto.FLOAT, [91, 23])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph), path)
    ceilings = tmp_path / "c.json"
    ceilings.write_text(json.dumps(_ceilings().as_dict()))
    assert main(["roofline", str(path), "--input-shape", "x=5x91", "--ceilings", str(ceilings), "--format",
                 "json"]) == 0
    (point,) = json.loads(capsys.readouterr().out)["points"]
    assert point["intensity"] == pytest.approx(intensity(5))
    pytest.importorskip("torch")
    (tmp_path / "roofline_linear.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(91, 23, bias=False)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path / "cache"))
    assert main(["roofline", "--torch", "roofline_linear:make", "--input-shape", "input=4x91", "--ceilings",
                 str(ceilings), "--format", "json"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert [p["intensity"] for p in points if "MatMul" in p["label"] or "Gemm" in p["label"]] == \
        [pytest.approx(intensity(4))]


def test_run_is_placed_under_the_ceiling_of_its_own_precision(tmp_path, capsys):
    # V100 ceilings per device: GEMM fp32 14.375 TFLOPS, GEMM mixed fp16 79.5 TFLOPS; one node, link 300 GB/s.
    # COI 100 FLOP/B: link roof 300 GB/s x 100 = 30 TFLOPS, above fp32's 14.375 (compute-bound in fp32) and below
    # fp16's 79.5 (the issue: an fp32 run judged against the mixed ceiling was called communication-bound)
    (tmp_path / "c.json").write_text(json.dumps(_ceilings(ranks=1, allreduce=300 * G).as_dict()))
    runs = [{"flops": 10 * T, "precision": "fp32", "communication": {"coi": 100.0}},
            {"flops": 20 * T, "precision": "fp16", "communication": {"coi": 100.0}}]
    (tmp_path / "run.json").write_text(json.dumps(_bench(runs, ranks=1)))
    rc = main(["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(tmp_path / "run.json"),
               "--format", "json"])
    assert rc == 0
    fp32, fp16 = json.loads(capsys.readouterr().out)["points"]
    assert fp32["compute_ceiling"] == "GEMM fp32" and fp32["bound"] == "compute"
    assert fp32["attainable_flops_per_s"] == pytest.approx(115 * T / 8)
    assert fp16["compute_ceiling"] == "GEMM mixed fp16" and fp16["bound"] == "communication"
    assert fp16["attainable_flops_per_s"] == pytest.approx(300 * G * 100)
