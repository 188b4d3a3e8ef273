"""``flopcount crosscheck``: the ncu CSV parser and metric plan, kernel attribution, the comparison, the command it
prints, its errors, and the ``--fallback torch`` comparison on CPU.

The CSV files under ``tests/measure/ncu/data/ncu/`` are format fixtures written to ncu's documented layout, not recorded
measurements; every FLOP figure expected here is derived in closed form from the counter values they hold.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from onnx import helper

from flopcount.cli import main
from flopcount.errors import MeasurementError
from flopcount.measure.ncu.crosscheck import (FAMILIES, analytic_by_family, attribute, compare, from_ncu,
                                          grouped_convolutions, measure_with_flop_counter)
from flopcount.measure.ncu.parse import nvtx_ranges, parse_ncu_csv, plan_metrics, read_ncu_csv

from helpers import model

DATA = Path(__file__).parent / "data" / "ncu"
RAW = str(DATA / "raw_page.csv")
DETAILS = str(DATA / "details_page.csv")

# the sizes written into the fixtures
M, N, K = 96, 160, 64  # FP32 GEMM on CUDA cores (TF32 off): M·N·K FMA instructions
MB, NB, KB = 256, 384, 512  # BF16 GEMM on tensor cores
MH, NH, KH = 128, 192, 320  # FP16 GEMM on tensor cores (details page)
CONV = 2 * 2 * 32 * 14 * 14 * 3 * 3 * 16  # 2·N·C_out·H_out·W_out·K²·C_in, TF32 tensor cores


def flops_by_id(export):
    return {k.id: k for k in export.kernels}


# ---------------------------------------------------------------------------------------------------------------
# Parser: raw page
# ---------------------------------------------------------------------------------------------------------------


def test_raw_page_kernels_and_flops():
    export = read_ncu_csv(RAW)
    assert export.layout == "raw"
    k = flops_by_id(export)
    assert len(k) == 12
    # a GEMM: one FMA per multiply-accumulate, FMA = 2 FLOPs → 2·M·N·K
    assert k["0"].cuda_core == {"fp32": 2 * M * N * K} and k["0"].flops == 1_966_080
    # an FMA-only kernel
    assert k["1"].flops == 2 * 50_176
    # a half kernel, pairs convention: 2·hadd + 2·hmul + 4·hfma
    assert k["2"].cuda_core == {"half": 2 * 1000 + 2 * 2000 + 4 * 3000}
    # tensor cores: ops are FLOPs; the _sparsity_off part is not added to its own aggregate; int8 is not FP work
    assert k["3"].tensor_core == {"bf16": 2 * MB * NB * KB} and k["3"].cuda_core == {}
    assert k["4"].tensor_core == {"tf32": CONV}
    # add + mul + 2·fma
    assert k["5"].flops == 4000 + 2000 + 2 * 1000
    assert k["6"].flops == 0  # max pool: comparisons are not counted
    assert k["10"].cuda_core == {"fp64": 5 + 3 + 2 * 10}
    # the NVTX cells as ncu writes them: the process (start/stop) phase, then the launching thread's push/pop stack
    assert k["0"].nvtx == "flopcount/forward > aten::linear, seq = 11, op_id = 40 > aten::addmm, op_id = 42"
    assert k["3"].nvtx == "flopcount/backward > AddmmBackward0, seq = 11, op_id = 90 > aten::mm, op_id = 91"
    assert k["10"].nvtx == ""


NONE6 = ":none" * 6


@pytest.mark.parametrize(("cell", "ranges"), [
    pytest.param(f'12  "<default domain>:flopcount/forward{NONE6}"  "<default domain>:aten::addmm, seq = 3{NONE6}" ',
                 ["flopcount/forward", "aten::addmm, seq = 3"], id="push-pop-stack-with-thread-id"),
    pytest.param(f'"7:<default domain>:flopcount/optimizer{NONE6}"', ["flopcount/optimizer"], id="start-stop-range"),
    pytest.param(f'"MyLib:a:b:c{NONE6}"', ["a:b:c"], id="own-domain-and-colons-in-the-name"),
    pytest.param(f'1  "<default domain>:red range:1:0:ARGB:0xFF0000:ASCII:x"', ["red range"], id="payload-and-colour"),
    pytest.param("flopcount/forward > aten::mul", ["flopcount/forward > aten::mul"], id="other-layout-kept-whole"),
    pytest.param("   ", [], id="empty"),
])
def test_nvtx_cells(cell, ranges):
    assert nvtx_ranges(cell) == ranges


def test_backward_kernels_on_autograd_thread_get_their_phase_from_the_process_range():
    """Push/pop ranges are per thread: a backward kernel launched by autograd's own thread does not see the main
    thread's ranges, so the phase comes from the start/stop (process) range column."""
    header = ('"ID","Process ID","Process Name","Host Name",'
              '"thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
              '"Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
              '"Kernel Name","sm__sass_thread_inst_executed_op_ffma_pred_on.sum"')
    rows = [f'"0","9","python","h","9  ""<default domain>:aten::add_{NONE6}"" ","""5:<default domain>:flopcount/optimizer'
            f'{NONE6}""","vectorized_elementwise_kernel","100"',
            f'"1","9","python","h","31  ""<default domain>:MulBackward0{NONE6}"" ","""4:<default domain>:flopcount/'
            f'backward{NONE6}""","vectorized_elementwise_kernel","10"']
    export = parse_ncu_csv("\n".join([header, *rows]), "step.csv")
    assert [attribute(k.name, k.nvtx)[0] for k in export.kernels] == ["optimizer", "element-wise"]
    assert export.kernels[1].nvtx == "flopcount/backward > MulBackward0"


def test_ncu_messages_between_rows_are_skipped():
    lines = Path(RAW).read_text().splitlines()
    lines.insert(5, "==WARNING== Found outstanding GPU clock reset, trying to revert...")
    lines.append("==PROF== Disconnected from process 4242")
    export = parse_ncu_csv("\n".join(lines), "step.csv")
    assert [k.flops for k in export.kernels] == [k.flops for k in read_ncu_csv(RAW).kernels]


def test_raw_page_half_packing_single():
    k = flops_by_id(read_ncu_csv(RAW, half_packing="single"))
    assert k["2"].cuda_core == {"half": 1000 + 2000 + 2 * 3000}
    assert k["0"].flops == 2 * M * N * K  # other precisions do not change


def test_raw_page_metric_plan():
    plan = read_ncu_csv(RAW).plan
    assert sorted(plan.tensor) == ["sm__ops_path_tensor_src_bf16_dst_fp32.sum",
                                   "sm__ops_path_tensor_src_tf32_dst_fp32.sum"]
    assert len(plan.cuda_core) == 9
    assert "part of sm__ops_path_tensor_src_bf16_dst_fp32.sum" in plan.ignored[
        "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum"]
    assert "integer" in plan.ignored["sm__ops_path_tensor_src_int8.sum"]
    assert "gpu__time_duration.sum" in plan.ignored


# ---------------------------------------------------------------------------------------------------------------
# Parser: details page
# ---------------------------------------------------------------------------------------------------------------


def test_details_page_kernels_and_flops():
    export = read_ncu_csv(DETAILS)
    assert export.layout == "details"
    k = flops_by_id(export)
    assert set(k) == {"0", "1", "2"}
    # ffma given in Minst (0.98304 Minst = M·N·K) under the smsp__ name of another ncu version
    assert k["0"].flops == 2 * M * N * K
    # aggregate sm__ops_path_tensor_src_fp16 = its hmma part + its hgmma part: only the aggregate is summed;
    # the n/a ffma cell is a counter not collected for this kernel
    assert k["1"].tensor_core == {"fp16": 2 * MH * NH * KH} and k["1"].cuda_core == {}
    assert k["2"].flops == 2 * 1536
    assert set(export.plan.tensor) == {"sm__ops_path_tensor_src_fp16.sum"}


def test_both_layouts_give_the_same_gemm():
    raw = flops_by_id(read_ncu_csv(RAW))["0"].flops
    details = flops_by_id(read_ncu_csv(DETAILS))["0"].flops
    assert raw == details == 2 * M * N * K


# ---------------------------------------------------------------------------------------------------------------
# Metric plan: aggregates never added to their own parts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("names", "summed"), [
    pytest.param(["sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum",
                  "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_on.sum"],
                 {"sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum",
                  "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_on.sum"}, id="disjoint-parts-both-summed"),
    pytest.param(["sm__ops_path_tensor_src_fp16_dst_fp16.sum", "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
                  "sm__ops_path_tensor_src_fp16.sum"],
                 {"sm__ops_path_tensor_src_fp16.sum"}, id="aggregate-over-destinations"),
    pytest.param(["sm__ops_path_tensor_src_fp16_dst_fp32.sum", "sm__ops_path_tensor_op_hgmma_src_fp16.sum"],
                 {"sm__ops_path_tensor_op_hgmma_src_fp16.sum"}, id="overlapping-keeps-one"),
    pytest.param(["sm__ops_path_tensor_src_fp16.sum", "sm__ops_path_tensor_src_bf16.sum",
                  "sm__ops_path_tensor_src_tf32.sum"],
                 {"sm__ops_path_tensor_src_fp16.sum", "sm__ops_path_tensor_src_bf16.sum",
                  "sm__ops_path_tensor_src_tf32.sum"}, id="source-types-are-disjoint"),
])
def test_plan_never_adds_an_aggregate_to_its_parts(names, summed):
    plan = plan_metrics(names)
    assert set(plan.tensor) == summed
    assert set(plan.ignored) == set(names) - summed


# ---------------------------------------------------------------------------------------------------------------
# Attribution and comparison
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel", "nvtx", "family"), [
    pytest.param("sm90_xmma_fprop_implicit_gemm_tf32f32", "", "convolution", id="cudnn-fprop-by-name"),
    pytest.param("sm90_xmma_gemm_bf16bf16", "", "matrix product", id="gemm-by-name"),
    pytest.param("vectorized_elementwise_kernel", "flopcount/backward > ConvolutionBackward0", "convolution",
                 id="nvtx-operator-wins"),
    pytest.param("vectorized_elementwise_kernel", "flopcount/optimizer > aten::add_", "optimizer",
                 id="optimizer-phase"),
    pytest.param("reduce_kernel", "flopcount/loss > aten::sum", "other", id="loss-phase"),
    pytest.param("cudnn::bn_fw_tr_1C11_kernel_NCHW", "", "normalization", id="cudnn-batch-norm"),
    pytest.param("max_pool_forward_nchw", "", "pooling", id="pooling"),
    pytest.param("reduce_kernel", "", "reduction", id="reduction"),
    pytest.param("my_kernel", "", "other", id="unknown"),
    pytest.param("cudnn::convertTensor_kernel", "", "other", id="convert-is-not-convolution"),
    pytest.param("elementwise_kernel<{lambda()#1}>", "", "element-wise", id="lambda-is-not-an-optimizer"),
])
def test_attribution(kernel, nvtx, family):
    assert attribute(kernel, nvtx)[0] == family


def test_families_of_the_raw_fixture():
    measured = from_ncu(read_ncu_csv(RAW))
    f = measured.families
    assert f["matrix product"] == 2 * (2 * M * N * K) + 2 * MB * NB * KB
    assert f["convolution"] == CONV
    assert f["element-wise"] == 2 * 50_176 + (2 * 1000 + 2 * 2000 + 4 * 3000)
    assert f["normalization"] == 4000 + 2000 + 2 * 1000
    assert f["pooling"] == 0
    assert f["reduction"] == 3000
    assert f["optimizer"] == 2 * 7000 + 1000
    assert f["other"] == 640 + (5 + 3 + 2 * 10)  # the loss's sum, and an unnamed fp64 kernel
    sgemm = next(k for k in measured.kernels if k.name == "ampere_sgemm_128x64_nn")
    assert sgemm.invocations == 2 and sgemm.measured_flops["cuda_core"] == {"fp32": 2 * 2 * M * N * K}
    assert "tf32" in measured.evidence["convolution"]


def test_compare_ratio_total_and_reasons():
    measured = from_ncu(read_ncu_csv(RAW))
    analytic = {fam: 0 for fam in FAMILIES} | {"matrix product": 4 * M * N * K, "convolution": 2 * CONV,
                                                 "element-wise": 1000, "optimizer": None}
    result = compare(analytic, measured)
    mp = result.families["matrix product"]
    assert mp.ratio == (4 * M * N * K + 2 * MB * NB * KB) / (4 * M * N * K)
    assert any("split-K" in r for r in mp.reasons)
    conv = result.families["convolution"]
    assert conv.ratio == 0.5 and any("Winograd" in r for r in conv.reasons)
    assert any("TF32" in r for r in conv.reasons)
    assert result.families["optimizer"].ratio is None
    assert "--optimizer" in result.families["optimizer"].reasons[0]
    # the total leaves out the optimizer (no analytic figure) and says so
    both = [f for f in FAMILIES if f != "optimizer"]
    assert result.total.analytic_flops == sum(analytic[f] for f in both)
    assert result.total.measured_flops == sum(measured.families[f] for f in both)
    assert any("optimizer" in r for r in result.total.reasons)


# ---------------------------------------------------------------------------------------------------------------
# Bad exports
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("hello\nworld\n", "no header row", id="not-csv"),
    pytest.param('"ID","Kernel Name","dram__bytes.sum"\n"","","byte"\n"0","k","12"\n', "no floating-point counter",
                 id="no-fp-metric"),
    pytest.param('"ID","Kernel Name","sm__sass_thread_inst_executed_op_ffma_pred_on.sum"\n"","","inst"\n"0","k","x1"\n',
                 "'x1' is not a number", id="garbage-value"),
    pytest.param('"ID","Kernel Name","sm__sass_thread_inst_executed_op_ffma_pred_on.sum"\n"","","inst"\n"0","k"\n',
                 "truncated", id="short-row"),
    pytest.param('"ID","Kernel Name","sm__sass_thread_inst_executed_op_ffma_pred_on.sum"\n"","","inst"\n"0","k","-5"\n',
                 "not a valid count", id="negative"),
])
def test_bad_exports_are_one_line_errors(text, message):
    with pytest.raises(MeasurementError, match=message):
        parse_ncu_csv(text, "bad.csv")


def test_cli_unreadable_export(tmp_path, save, capsys):
    path = tmp_path / "step.csv"
    path.write_text("not an export\n")
    m = save(model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [M, K], "b": [K, N]}, ["y"]))
    assert main(["crosscheck", "--ncu-csv", str(path), m]) == 12
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "ncu --csv --page raw" in err[0]


# ---------------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------------


def test_cli_ncu_csv_json(save, capsys):
    # MatMul [M,K]·[K,N]: 2·M·N·K FLOPs, inference
    m = save(model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [M, K], "b": [K, N]}, ["y"]))
    assert main(["crosscheck", "--ncu-csv", RAW, m, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"families", "total", "kernels", "ncu"}
    assert set(out["families"]) == set(FAMILIES)
    mp = out["families"]["matrix product"]
    assert set(mp) == {"analytic_flops", "measured_flops", "ratio", "reasons"}
    assert mp["analytic_flops"] == 2 * M * N * K
    assert mp["measured_flops"] == 2 * (2 * M * N * K) + 2 * MB * NB * KB
    assert mp["ratio"] == pytest.approx(mp["measured_flops"] / mp["analytic_flops"])
    assert out["families"]["convolution"]["analytic_flops"] == 0 and out["families"]["convolution"]["ratio"] is None
    assert {"name", "family", "invocations", "measured_flops"} <= set(out["kernels"][0])
    assert out["ncu"]["layout"] == "raw" and "sm__ops_path_tensor_src_bf16_dst_fp32.sum" in out["ncu"]["metrics_found"]
    assert "pairs" in out["ncu"]["conventions"]["half_packing"]


def test_cli_ncu_csv_table(save, capsys):
    m = save(model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [M, K], "b": [K, N]}, ["y"]))
    assert main(["crosscheck", "--ncu-csv", DETAILS, m]) == 0
    out = capsys.readouterr().out
    assert "measured by: ncu" in out and "matrix product" in out and "likely reasons:" in out
    assert "half_packing: pairs" in out


def test_print_ncu_command(capsys):
    assert main(["crosscheck", "--print-ncu-command", "--torch", "pkg.nets:make", "--input-shape", "x=32x3x224x224",
                 "--mode", "train", "--precision", "bf16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cmd = shlex.split(lines[0])
    assert cmd[0] == "ncu"
    for flag in ("--csv", "--nvtx"):
        assert flag in cmd
    assert cmd[cmd.index("--page") + 1] == "raw" and cmd[cmd.index("--print-units") + 1] == "base"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    metrics = cmd[cmd.index("--metrics") + 1]
    assert "sm__sass_thread_inst_executed_op_" in metrics and "sm__ops_path_tensor_src_" in metrics
    driver = cmd[cmd.index("--log-file") + 2:]
    assert driver[:3] == ["python", "-m", "flopcount.measure.ncu_step"]
    assert driver[driver.index("--torch") + 1] == "pkg.nets:make"
    assert driver[driver.index("--mode") + 1] == "train" and driver[driver.index("--precision") + 1] == "bf16"
    assert lines[1].startswith("# then") and "--ncu-csv step.csv" in lines[1]


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
def test_every_counted_optimizer_reaches_the_profiled_step(optimizer, capsys):
    # crosscheck offers each optimizer the count knows (adamw included), and the step's parser takes it
    from flopcount.cli import ncu_step
    from flopcount.options import OPTIMIZERS

    assert optimizer in OPTIMIZERS
    assert main(["crosscheck", "--print-ncu-command", "--torch", "pkg.nets:make", "--input-shape", "x=2x3",
                 "--mode", "train", "--optimizer", optimizer]) == 0
    cmd = shlex.split(capsys.readouterr().out.splitlines()[0])
    driver = cmd[cmd.index("--log-file") + 2:]
    assert driver[driver.index("--optimizer") + 1] == optimizer
    assert ncu_step.build_parser().parse_args(driver[3:]).optimizer == optimizer


def test_print_ncu_command_explicit_metrics_parse_as_planned(capsys):
    assert main(["crosscheck", "--print-ncu-command", "--explicit-metrics", "--torch", "p:f", "--input-shape",
                 "x=1x8"]) == 0
    cmd = shlex.split(capsys.readouterr().out.splitlines()[0])
    names = cmd[cmd.index("--metrics") + 1].split(",")
    plan = plan_metrics(names)
    assert set(plan.used) == set(names) and not plan.ignored  # every printed metric is summed, none twice


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--torch", "p:f", "--input-shape", "x=1x8"], "say what to compare", id="no-action"),
    pytest.param(["--print-ncu-command", "m.onnx"], "give --torch", id="command-needs-torch"),
    pytest.param(["--fallback", "torch", "m.onnx"], "give --torch", id="fallback-needs-torch"),
    pytest.param(["--ncu-csv", "step.csv"], "give --torch MODULE:FACTORY, or the path", id="no-model"),
    pytest.param(["--ncu-csv", "step.csv", "--torch", "p:f"], "--input-shape", id="torch-needs-shapes"),
])
def test_usage_errors(argv, message, capsys):
    assert main(["crosscheck", *argv]) == 2
    assert message in capsys.readouterr().err


def test_run_without_ncu_says_what_is_missing(capsys, tmp_path):
    missing = str(tmp_path / "no-such-ncu")
    assert main(["crosscheck", "--run", "--ncu", missing, "--torch", "p:f", "--input-shape", "x=1x8"]) == 11
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not on PATH" in err[0] and "--fallback torch" in err[0]


def test_step_driver_without_cuda(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from flopcount.cli import ncu_step

    assert ncu_step.main(["--gemm", "64", "64", "64", "--precision", "bf16"]) == 11
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
    assert ncu_step.main(["--precision", "fp32"]) == 2  # neither --torch nor --gemm


def _fake_ncu(tmp_path, output: str) -> str:
    """An executable named ncu that prints ``output`` and fails, as ncu does when counters are refused."""
    path = tmp_path / "ncu"
    path.write_text(f"#!/bin/sh\necho '{output}'\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def test_run_without_cuda_says_what_is_missing(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    ncu = _fake_ncu(tmp_path, "NVIDIA (R) Nsight Compute Command Line Profiler")
    assert main(["crosscheck", "--run", "--ncu", ncu, "--torch", "p:f", "--input-shape", "x=1x8"]) == 11
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.cuda.is_available() is False" in err[0] and "--fallback torch" in err[0]


def test_counter_permission_refused_is_a_device_error(tmp_path):
    from flopcount.errors import DeviceError
    from flopcount.cli.crosscheck import _profile, build_parser

    ncu = _fake_ncu(tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                              "Performance Counters on the target device 0.")
    args = build_parser().parse_args(["--run", "--torch", "p:f", "--input-shape", "x=1"])
    with pytest.raises(DeviceError, match="ERR_NVGPUCTRPERM.*NVreg_RestrictProfilingToAdminUsers=0"):
        _profile(ncu, ["python", "-c", "pass"], str(tmp_path / "step.csv"), args)


# ---------------------------------------------------------------------------------------------------------------
# --fallback torch on the CPU
# ---------------------------------------------------------------------------------------------------------------

SMALL_NET = textwrap.dedent("""
    import torch.nn as nn

    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 5 * 5, 10))
""")


@pytest.fixture(scope="module")
def small_net(tmp_path_factory):
    """A factory module on sys.path, and one export cache for the tests of this file (each export takes seconds)."""
    folder = tmp_path_factory.mktemp("small_net")
    (folder / "crosscheck_small_net.py").write_text(SMALL_NET)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        mp.setenv("FLOPCOUNT_CACHE", str(folder / "cache"))
        mp.chdir(folder)
        yield "crosscheck_small_net:make"
    sys.modules.pop("crosscheck_small_net", None)


def test_fallback_torch_small_net(small_net, capsys):
    pytest.importorskip("torch")
    assert main(["crosscheck", "--fallback", "torch", "--torch", small_net, "--input-shape", "input=2x3x10x10",
                 "--mode", "train", "--convention", "dense", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    conv_fwd = 2 * 2 * 8 * 10 * 10 * 3 * 3 * 3  # 2·N·C_out·H·W·K²·C_in
    lin_fwd = 2 * 2 * 200 * 10  # 2·N·in·out
    conv, mp = out["families"]["convolution"], out["families"]["matrix product"]
    # the first layer reads data: its backward is the weight gradient only; the linear layer computes dW and dX
    assert conv["measured_flops"] == conv["analytic_flops"] == 2 * conv_fwd
    assert mp["measured_flops"] == mp["analytic_flops"] == 3 * lin_fwd
    assert conv["ratio"] == mp["ratio"] == 1.0
    assert out["families"]["pooling"]["measured_flops"] is None
    assert "only convolutions and matrix products" in out["families"]["pooling"]["reasons"][0]
    assert out["ncu"]["source"] == "torch.utils.flop_counter.FlopCounterMode"


def test_fallback_torch_default_convention_explains_bias(small_net, capsys):
    pytest.importorskip("torch")
    assert main(["crosscheck", "--fallback", "torch", "--torch", small_net, "--input-shape", "input=2x3x10x10",
                 "--mode", "train"]) == 0
    out = capsys.readouterr().out
    assert "measured by: torch.utils.flop_counter.FlopCounterMode" in out
    assert "products only" in out  # the linear layer's bias add is counted analytically, not by FlopCounterMode


def test_run_falls_back_to_torch_when_ncu_is_missing(small_net, tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["crosscheck", "--run", "--fallback", "torch", "--ncu", str(tmp_path / "absent"), "--torch", small_net,
                 "--input-shape", "input=2x3x10x10", "--mode", "train", "--format", "json"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("flopcount: WARNING: ")]
    assert "not on PATH" in warnings[0] and "comparing with torch.utils.flop_counter" in warnings[1]
    out = json.loads(captured.out)
    assert out["ncu"]["source"] == "torch.utils.flop_counter.FlopCounterMode"
    assert out["families"]["convolution"]["measured_flops"] == 2 * (2 * 2 * 8 * 10 * 10 * 3 * 3 * 3)


def _grouped_conv_weight_grad_overcount(module, inputs) -> int:
    """(G − 1) × the weight gradient's products of each grouped convolution, from the torch module itself."""
    import torch

    extra = []

    def hook(conv, args, out):
        if conv.groups > 1:
            c_in_per_group = conv.in_channels // conv.groups
            per_out = out.shape[0] * out.shape[2] * out.shape[3]
            dw = 2 * conv.out_channels * per_out * c_in_per_group * conv.kernel_size[0] * conv.kernel_size[1]
            extra.append((conv.groups - 1) * dw)

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        module.eval()(*inputs)
    for h in handles:
        h.remove()
    return sum(extra)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet-v2"])
def test_fallback_torch_reference_models(name, tmp_path):
    pytest.importorskip("torch")
    from flopcount.frontends.torch import from_torch
    from flopcount.models import zoo

    built = zoo.build(name, image_size=64)
    overcount = _grouped_conv_weight_grad_overcount(built.module, built.inputs)
    report = from_torch(built.module, built.inputs, mode="train", convention="dense", cache_dir=str(tmp_path))
    analytic = analytic_by_family(report)
    measured = measure_with_flop_counter(built.module, built.inputs, "train")
    result = compare(analytic, measured, "torch", {"convention": "dense",
                                                   "grouped_convolutions": grouped_convolutions(report)})
    conv, mp = result.families["convolution"], result.families["matrix product"]
    # the classifier: dense 2·2048·1000 (ResNet-50) or 2·1280·1000 (MobileNetV2), forward + dW + dX
    assert mp.analytic_flops == mp.measured_flops == 3 * 2 * (2048 if name == "resnet50" else 1280) * 1000
    # convolutions agree exactly, except FlopCounterMode's known G-fold weight gradient of grouped convolutions
    assert conv.measured_flops == conv.analytic_flops + overcount
    if name == "resnet50":
        assert overcount == 0 and conv.ratio == 1.0 and conv.reasons == ()
    else:
        assert overcount > 0 and any("G times" in r for r in conv.reasons)


# ---------------------------------------------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------------------------------------------


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda() or shutil.which("ncu") is None, reason="needs a CUDA GPU and ncu")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gemm_calibration_on_gpu(precision, tmp_path):
    from flopcount.cli.crosscheck import build_parser, calibrate

    args = build_parser().parse_args(["--run", "--torch", "p:f", "--input-shape", "x=1", "--calibration-size", "2048"])
    result = calibrate(shutil.which("ncu"), precision, args, str(tmp_path))
    assert result["expected_flops"] == 2 * 2048 ** 3
    assert abs(result["factor"] - 1) <= 0.01


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda() or shutil.which("ncu") is None, reason="needs a CUDA GPU and ncu")
def test_run_small_net_on_gpu(small_net, capsys):
    assert main(["crosscheck", "--run", "--torch", small_net, "--input-shape", "input=8x3x10x10", "--mode", "train",
                 "--calibration-size", "2048", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ncu"]["calibration"]["fp32"]["within_1_percent"]
    assert out["families"]["matrix product"]["measured_flops"] > 0


@pytest.mark.parametrize("module", ["flopcount.measure.ncu.parse", "flopcount.measure.ncu.crosscheck"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_step_driver_marks_phases_with_process_ranges(small_net, monkeypatch):
    """The driver's step on the CPU, NVTX and the CUDA profiler replaced by recorders: exactly one step inside the
    profiled window, its phases in order as start/end (process) ranges, the backward one open while autograd's own
    thread runs the backward."""
    import contextlib
    import threading

    torch = pytest.importorskip("torch")
    from flopcount.cli import ncu_step
    from flopcount.measure.ncu import step as ncu_driver

    events = []
    open_ranges = {}
    backward_ranges = []

    def range_start(msg):
        rid = len(events)
        events.append(("start", msg))
        open_ranges[rid] = msg
        return rid

    def range_end(rid):
        events.append(("end", open_ranges.pop(rid)))

    monkeypatch.setattr(torch.cuda.nvtx, "range_start", range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", range_end)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda msg: pytest.fail("phases must not be push/pop ranges"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append(("profiler", "start")))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append(("profiler", "stop")))
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", contextlib.nullcontext)
    # the driver sets the TF32 and autotuning flags for the process: restored below (they are properties of
    # torch's backend modules, which monkeypatch cannot undo)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)

    real_forward = torch.nn.Linear.forward

    def linear_forward(self, x):  # records the ranges open while the gradient of each Linear output is computed
        y = real_forward(self, x)
        if y.requires_grad:
            y.register_hook(lambda g: backward_ranges.append(tuple(open_ranges.values())))
        return y

    monkeypatch.setattr(torch.nn.Linear, "forward", linear_forward)
    args = ncu_step.build_parser().parse_args(["--torch", small_net, "--input-shape", "input=2x3x10x10",
                                               "--optimizer", "sgd", "--warmup", "2"])
    try:
        ncu_driver.run_model(torch, args, device="cpu")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags

    phases = ["flopcount/forward", "flopcount/loss", "flopcount/backward", "flopcount/optimizer"]
    one_step = [e for p in phases for e in (("start", p), ("end", p))]
    assert events == one_step * 2 + [("profiler", "start"), *one_step, ("profiler", "stop")]
    assert backward_ranges == [("flopcount/backward",)] * 3  # two warm-up steps and the profiled one


def test_cli_ncu_report_file_is_read_through_ncu_import(save, tmp_path, capsys):
    """A .ncu-rep report is turned into the raw-page CSV by ncu --import (a stand-in ncu here, which prints the
    raw fixture for exactly that command line); without ncu, one line says how to export the CSV."""
    m = save(model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [M, K], "b": [K, N]}, ["y"]))
    report = tmp_path / "step.ncu-rep"
    report.write_bytes(b"\x00binary report")
    ncu = tmp_path / "ncu"
    ncu.write_text(f'#!/bin/sh\n[ "$*" = "--import {report} --csv --page raw --print-units base" ] || exit 3\n'
                   f"cat {RAW}\n")
    ncu.chmod(0o755)
    assert main(["crosscheck", "--ncu-csv", str(report), "--ncu", str(ncu), m, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["families"]["matrix product"]["measured_flops"] == 2 * (2 * M * N * K) + 2 * MB * NB * KB
    assert main(["crosscheck", "--ncu-csv", str(report), "--ncu", str(tmp_path / "absent"), m]) == 11
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ncu --import" in err[0] and "--ncu-csv step.csv" in err[0]


# ---------------------------------------------------------------------------------------------------------------
# a transformers model whose masks read values: FlopCounterMode on real CPU tensors; the profiler's SDPA gap

TINY_LLAMA = textwrap.dedent("""
    def make():
        from transformers import LlamaConfig, LlamaModel
        return LlamaModel(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32))
""")
B, S, H, LAYERS = 2, 16, 32, 2


def factory_module(tmp_path_factory, name: str, source: str):
    """``NAME:make`` of a module written from ``source`` into a folder on sys.path (and the working directory), with
    an export cache of its own; the module is forgotten afterwards."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.py").write_text(source)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        mp.setenv("FLOPCOUNT_CACHE", str(folder / "cache"))
        mp.chdir(folder)
        yield f"{name}:make"
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    yield from factory_module(tmp_path_factory, "crosscheck_tiny_llama", TINY_LLAMA)


LLAMA_ARGS = ["--input-shape", f"input_ids={B}x{S}:int64", "--input-shape", f"attention_mask={B}x{S}:int64",
              "--mode", "train", "--format", "json"]


def test_fallback_torch_runs_on_cpu_where_meta_cannot(tiny_llama, capsys):
    assert main(["crosscheck", "--fallback", "torch", "--torch", tiny_llama, *LLAMA_ARGS]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ncu"]["device"].startswith("cpu (one step on real tensors")
    assert "Tensor.item() cannot be called on meta tensors" in out["ncu"]["device"]
    mp = out["families"]["matrix product"]
    # per layer, forward: q, k, v, o projections 4 x 2·T·H·H, the MLP's gate, up, down 3 x 2·T·H·I (T = B·S tokens,
    # I = 64), attention Q·Kᵀ and A·V 2 x 2·B·S·S·H; backward twice the forward (dX and dW) but for attention (dQ,
    # dK, dV, dA: also twice). No LM head (LlamaModel).
    T_, I_ = B * S, 64
    forward = LAYERS * (4 * 2 * T_ * H * H + 3 * 2 * T_ * H * I_ + 2 * 2 * B * S * S * H)
    assert mp["measured_flops"] == 3 * forward  # FlopCounterMode on the CPU, attention's products included
    assert mp["analytic_flops"] == mp["measured_flops"]


def test_profiler_fallback_names_the_missing_attention(tiny_llama, capsys):
    assert main(["crosscheck", "--fallback", "torch-profiler", "--torch", tiny_llama, *LLAMA_ARGS]) == 0
    out = json.loads(capsys.readouterr().out)
    mp = out["families"]["matrix product"]
    attention = LAYERS * 3 * 2 * 2 * B * S * S * H  # Q·Kᵀ and A·V, forward and backward: what the profiler misses
    assert mp["analytic_flops"] - mp["measured_flops"] == attention
    assert any("scaled-dot-product attention" in r for r in mp["reasons"])


# ---------------------------------------------------------------------------------------------------------------
# GPT-2, whose forward(input_ids, past_key_values, attention_mask, ...) takes the mask third: inputs go by name

TINY_GPT2 = textwrap.dedent("""
    def make():
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32))
""")
E, V = 64, 100  # GPT-2's width and vocabulary (B, S and LAYERS as for Llama)


def gpt2_forward_products(b: int, s: int) -> int:
    """Products of one GPT-2 forward, T = B·S tokens: per layer the attention's c_attn (E → 3E) and c_proj (E → E),
    the MLP's c_fc (E → 4E) and c_proj (4E → E), 2·T·E·E·(3 + 1 + 4 + 4), and attention's Q·Kᵀ and A·V,
    2 × 2·B·S·S·E; the LM head 2·T·E·V."""
    t = b * s
    return LAYERS * (2 * t * E * E * (3 + 1 + 4 + 4) + 2 * 2 * b * s * s * E) + 2 * t * E * V


def gpt2_bias_adds(b: int, s: int) -> int:
    """The biases of those four products (Gemm's C, counted analytically; FlopCounterMode counts products only):
    T·(3E + E + 4E + E) per layer."""
    return LAYERS * b * s * (3 * E + E + 4 * E + E)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    yield from factory_module(tmp_path_factory, "crosscheck_tiny_gpt2", TINY_GPT2)


def test_fallback_torch_binds_gpt2_attention_mask_by_name(tiny_gpt2, capsys):
    """attention_mask went positionally into past_key_values (an internal error, exit 1); by name both sides count
    the same products, forward and backward (dX and dW: three times the forward)."""
    assert main(["crosscheck", "--fallback", "torch", "--torch", tiny_gpt2, *LLAMA_ARGS]) == 0
    mp = json.loads(capsys.readouterr().out)["families"]["matrix product"]
    assert mp["measured_flops"] == 3 * gpt2_forward_products(B, S)
    # bias adds, forward and their gradient (a sum over the T tokens)
    assert mp["analytic_flops"] == mp["measured_flops"] + 2 * gpt2_bias_adds(B, S)


def test_flop_counter_takes_gpt2_inputs_by_name(tiny_gpt2):
    """The Python API: forward_inputs names each tensor after forward()'s parameter, in its order."""
    import importlib

    from flopcount.frontends.torch import forward_inputs, from_torch

    module = importlib.import_module(tiny_gpt2.split(":")[0]).make().eval()
    given = {"attention_mask": ((1, S), "int64"), "input_ids": ((1, S), "int64")}
    inputs = forward_inputs(module, given)
    assert list(inputs) == ["input_ids", "attention_mask"]
    assert [tuple(t.shape) for t in inputs.values()] == [(1, S), (1, S)]
    measured = measure_with_flop_counter(module, inputs, "inference")
    analytic = analytic_by_family(from_torch(module, given))
    assert measured.families["matrix product"] == gpt2_forward_products(1, S)
    assert analytic["matrix product"] == gpt2_forward_products(1, S) + gpt2_bias_adds(1, S)
