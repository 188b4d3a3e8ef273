"""Predicted beside measured step time: real training runs on this CPU over gloo (1, 2 or 4 processes on this
host) against ``flopcount --predict``, from profiles calibrated beforehand in separate processes (each rank count's
just before its runs, which go together) and never fitted to these runs.

Each run trains a small decoder built here from a configuration (``LlamaForCausalLM``, and ``GPT2LMHeadModel`` on
one rank; random weights, nothing downloaded) with AdamW, one thread per process (the profiles are calibrated with
``--threads 1``): one rank, data parallel (DDP, ``no_sync`` on all microbatches but the last), a 2-stage pipeline
(GPipe and 1F1B, the stages' activations and gradients sent with gloo), FSDP2 (``fully_shard`` on each decoder
layer, then the root, its default gradient sync), tensor parallelism with and without sequence parallelism
(``step_time_tp``), expert parallelism of a Mixtral over its data-parallel ranks (``step_time_ep``: the run's
routing recorded and given to the prediction as ``--expert-load``, the one prediction made after its run), context
parallelism of a Llama over 2 ranks (``step_time_cp``: each rank its zigzag half of every sequence, the K and V
gathered per layer, DDP over the CP ranks), and recompute (torch's non-reentrant checkpoint around each decoder layer: ``--recompute non-reentrant``). A step is
timed from a barrier to the end of the optimizer step on the slowest rank, after warm-up steps; the median and the
spread (slowest/fastest) of the repeats are printed beside the prediction's error.

    PYTHONPATH=$PWD python3 benchmarks/step_time.py            # every run (several minutes)
    PYTHONPATH=$PWD python3 benchmarks/step_time.py --runs 1rank-llama-b4,dp2-m1 --repeats 3
    PYTHONPATH=$PWD python3 benchmarks/step_time.py --passes 2   # every run twice, minutes apart (twice as long)

With ``--passes N`` every run is timed N times, one pass over all the runs after another, each pass calibrating its
own profiles: each run's figures are the medians over the passes, printed beside the spread between the passes'
medians (the machine's drift over minutes, which the repeats of one pass, consecutive steps, do not show).

The CPU's cores are shared with whatever else runs: the 1-minute load average is printed beside each run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
         "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 2048,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
# GPT-2 with its dropouts (0.1 by default: the embedding's, the attention's and each residual branch's): the training
# count holds them (Dropout nodes), timed at the profile's dropout rate (torch's CPU dropout draws its mask far slower
# than an elementwise operator moves its bytes).
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 256, "n_head": 8, "n_layer": 4,
        "vocab_size": 2048, "n_positions": 512, "tie_word_embeddings": False}
# A Mixtral-like MoE decoder: 4 experts a layer, 2 per token (transformers' grouped experts); its router's
# auxiliary loss off, as the model's configuration has it by default.
MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 256,
           "intermediate_size": 344, "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 2048, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
MODELS = {"llama": LLAMA, "gpt2": GPT2, "mixtral": MIXTRAL}
SEQ = 128


@dataclass(frozen=True)
class Run:
    name: str
    model: str  # "llama", "gpt2" or "mixtral"
    batch: int  # a microbatch
    dp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"
    tp: int = 1  # tensor parallel (without a pipeline): step_time_tp.TensorParallelLM
    fsdp: bool = False  # data parallel with FSDP2 (fully_shard on each decoder layer, then the root)
    sp: bool = False  # sequence parallelism beside tp (step_time_tp.TensorParallelLM's sp)
    ep: int = 1  # expert parallelism over the dp ranks (step_time_ep.ExpertParallelMoe; a Mixtral, without tp or pp)
    cp: int = 1  # context parallelism (step_time_cp's zigzag; a Llama, without dp, tp or pp)

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp * self.cp


RUNS = (
    Run("1rank-llama-b2", "llama", 2),
    Run("1rank-llama-b4", "llama", 4),
    Run("1rank-llama-b8", "llama", 8),
    Run("1rank-llama-b4-recompute", "llama", 4, recompute="non-reentrant"),
    Run("1rank-gpt2-b2", "gpt2", 2),
    Run("1rank-gpt2-b4", "gpt2", 4),
    Run("dp2-m1", "llama", 4, dp=2),
    Run("dp2-m2", "llama", 4, dp=2, microbatches=2),
    Run("dp2-m1-recompute", "llama", 4, dp=2, recompute="non-reentrant"),
    Run("pp2-gpipe-m2", "llama", 4, pp=2, microbatches=2, schedule="gpipe"),
    Run("pp2-gpipe-m4", "llama", 4, pp=2, microbatches=4, schedule="gpipe"),
    Run("pp2-1f1b-m2", "llama", 4, pp=2, microbatches=2),
    Run("pp2-1f1b-m4", "llama", 4, pp=2, microbatches=4),
    Run("pp2-1f1b-m4-recompute", "llama", 4, pp=2, microbatches=4, recompute="non-reentrant"),
    Run("dp2-pp2-1f1b-m2", "llama", 4, dp=2, pp=2, microbatches=2),
    Run("tp2", "llama", 4, tp=2),
    Run("tp2-m2", "llama", 4, tp=2, microbatches=2),
    Run("tp2-recompute", "llama", 4, tp=2, recompute="non-reentrant"),
    Run("tp2-dp2", "llama", 4, tp=2, dp=2),
    Run("tp2-sp", "llama", 4, tp=2, sp=True),
    Run("dp2-fsdp-m1", "llama", 4, dp=2, fsdp=True),
    Run("dp2-fsdp-m2", "llama", 4, dp=2, microbatches=2, fsdp=True),
    Run("1rank-mixtral-b4", "mixtral", 4),
    Run("dp2-mixtral", "mixtral", 4, dp=2),
    Run("ep2-mixtral", "mixtral", 4, dp=2, ep=2),
    Run("cp2", "llama", 4, cp=2),
    Run("cp2-recompute", "llama", 4, cp=2, recompute="non-reentrant"),
)


def _build(model: str):
    import torch
    import transformers

    values = MODELS[model]
    config = transformers.AutoConfig.for_model(values["model_type"], **{
        k: v for k, v in values.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    m = getattr(transformers, values["architectures"][0])(config)
    m.train()
    return m


def _loss(logits, ids):
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _cp_loss(model, ids, pos):
    """The loss of a CP rank's tokens (positions ``pos`` of each sequence, step_time_cp's zigzag): each predicts
    the next token of the whole sequence, the sequence's last none."""
    import torch.nn.functional as F

    b = ids.shape[0]
    logits = model(input_ids=ids[:, pos], position_ids=pos[None].expand(b, -1)).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), cp_labels(ids, pos).flatten(), ignore_index=-100)


def cp_labels(ids, pos):
    """The next token of the whole sequence ``ids`` after each position of ``pos``; -100 (ignored) after the last."""
    nxt = pos + 1
    return ids[:, nxt.clamp(max=ids.shape[1] - 1)].masked_fill(nxt[None] >= ids.shape[1], -100)


class _Stage:
    """One pipeline stage of a Llama model: stage 0 the embedding and the first layers, the last stage the rest,
    the final norm, the head and the loss; each stage builds its own rotary table."""

    def __init__(self, model, stage: int, stages: int):
        import torch

        layers = model.model.layers
        per = len(layers) // stages
        self.first, self.last = stage == 0, stage == stages - 1
        self.layers = layers[stage * per:(stage + 1) * per]
        self.model = model
        self.params = [p for m in ([model.model.embed_tokens] if self.first else []) + list(self.layers)
                       + ([model.model.norm, model.lm_head] if self.last else []) for p in m.parameters()]
        self.pos = torch.arange(SEQ).unsqueeze(0)

    def forward(self, x, ids):
        h = self.model.model.embed_tokens(ids) if self.first else x
        pe = self.model.model.rotary_emb(h, position_ids=self.pos)
        for layer in self.layers:
            if self.model.is_gradient_checkpointing:
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(lambda t, layer=layer: layer(t, position_embeddings=pe, position_ids=self.pos), h,
                               use_reentrant=False)
            else:
                h = layer(h, position_embeddings=pe, position_ids=self.pos)
        if self.last:
            return _loss(self.model.lm_head(self.model.model.norm(h)), ids)
        return h


def worker(rank: int, run: Run, port: int, out: str, warmup: int, repeats: int) -> None:
    """One training process: ``warmup`` then ``repeats`` timed steps; rank 0 writes the slowest rank's seconds."""
    import torch

    torch.set_num_threads(1)
    dist = None
    if run.world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=run.world,
                                timeout=datetime.timedelta(seconds=120))
    model = _build(run.model)
    if run.recompute == "non-reentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tp_rank = rank % run.tp  # rank = tp + T·(dp + D·stage): tp fastest, then dp, then the stage
    pp_rank, dp_rank = divmod(rank // run.tp, run.dp)
    g = torch.Generator().manual_seed(1 + dp_rank)
    ids = [torch.randint(0, LLAMA["vocab_size"], (run.batch, SEQ), generator=g) for _ in range(run.microbatches)]
    stage = _Stage(model, pp_rank, run.pp) if run.pp > 1 else None
    pos = None
    if run.cp > 1:  # the rank's zigzag tokens of each sequence; DDP's all_reduce over the CP ranks (dp_cp)
        from step_time_cp import context_parallel

        pos = context_parallel(model, rank, run.cp, None, SEQ)
    params = stage.params if stage else list(model.parameters())
    dp_group, net = None, None
    if run.world > 1 and run.dp > 1:  # every rank makes every group, in the same order
        groups = {(s, i): dist.new_group([i + run.tp * (d + run.dp * s) for d in range(run.dp)])
                  for s in range(run.pp) for i in range(run.tp)}
        dp_group = groups[(pp_rank, tp_rank)]
    pp_ranks = [s * run.dp + dp_rank for s in range(run.pp)]
    if run.tp > 1:
        from step_time_tp import TensorParallelLM

        tp_groups = [dist.new_group([i + run.tp * d for i in range(run.tp)]) for d in range(run.dp)]
        net = TensorParallelLM(model, tp_rank, run.tp, tp_groups[dp_rank], sp=run.sp)
        params = list(net.parameters())
    ddp, moe = None, []
    if run.ep > 1:  # the EP groups are the dp ranks in runs of ep; the experts' gradients stay on their rank
        from step_time_ep import expert_names, expert_parallel

        ep_groups = [dist.new_group(list(range(g, g + run.ep))) for g in range(0, run.dp, run.ep)]
        moe = expert_parallel(model, rank % run.ep, run.ep, ep_groups[rank // run.ep])
        from torch.nn.parallel import DistributedDataParallel

        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, expert_names(model))
        params = list(model.parameters())
    if run.fsdp:  # FSDP2 as torchtitan applies it; its default gradient sync reduce-scatters every microbatch
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=_mesh(dp_group))
        fully_shard(model, mesh=_mesh(dp_group))
        params = list(model.parameters())
    elif (run.dp > 1 or run.cp > 1) and run.pp == 1:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(net or model, process_group=dp_group)
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step():
        if run.pp > 1:
            _pipeline_step(stage, run, pp_rank, ids, pp_ranks)
            if dp_group is not None:  # one all_reduce of the stage's gradients (flattened) per step
                flat = torch.cat([p.grad.flatten() for p in params])
                dist.all_reduce(flat, group=dp_group)
        else:
            for j in range(run.microbatches):
                ctx = ddp.no_sync() if ddp is not None and j < run.microbatches - 1 else _null()
                with ctx:
                    if run.tp > 1:
                        loss = (ddp or net)(ids[j]) / run.microbatches
                    elif pos is not None:
                        loss = _cp_loss(ddp or model, ids[j], pos) / run.microbatches
                    else:
                        loss = _loss((ddp or model)(input_ids=ids[j]).logits, ids[j]) / run.microbatches
                    loss.backward()
            if net is not None:
                net.reduce_norm_grads()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times, cpus = [], []
    for k in range(warmup + repeats):
        for block in moe:  # the routing of the timed steps
            block.record = k >= warmup
        if dist is not None:
            dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if k >= warmup:
            times.append(t)
            cpus.append(c)
    per_rank = [cpus]
    if dist is not None:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank of each step
        times = t.tolist()
        per_rank = [None] * run.world
        dist.all_gather_object(per_rank, cpus)
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:  # expert_load: each MoE layer's tokens per expert a microbatch
            json.dump({"wall": times, "cpu": per_rank,
                       "expert_load": [(b.counts / (repeats * run.microbatches)).tolist() for b in moe] or None}, f)


def _pipeline_step(st: _Stage, run: Run, stage: int, ids, ranks) -> None:
    """One optimizer step's forwards and backwards of this stage, in the run's schedule (GPipe: every forward,
    then every backward; 1F1B: P-1-p warm-up forwards, then one forward and one backward in turn); ``ranks``: the
    global ranks of the pipeline's stages. Sends are posted without waiting (isend), receives wait."""
    import torch
    import torch.distributed as dist

    m = run.microbatches
    outs, ins, pending = {}, {}, []
    nxt = ranks[stage + 1] if not st.last else None
    prv = ranks[stage - 1] if not st.first else None
    shape = (run.batch, SEQ, LLAMA["hidden_size"])

    def fwd(j):
        if st.first:
            out = st.forward(None, ids[j])
            pending.append(dist.isend(out.detach().contiguous(), nxt))
        else:
            x = torch.empty(shape)
            dist.recv(x, prv)
            x.requires_grad_(True)
            ins[j] = x
            out = st.forward(x, ids[j])
        if st.last:
            out = out / m
        outs[j] = out

    def bwd(j):
        if st.last:
            outs[j].backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, nxt)
            outs[j].backward(grad)
        if not st.first:
            pending.append(dist.isend(ins.pop(j).grad.contiguous(), prv))
        del outs[j]

    if run.schedule == "gpipe":
        order = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    else:
        warm = min(run.pp - 1 - stage, m)
        order = [("F", j) for j in range(warm)]
        for j in range(warm, m):
            order += [("F", j), ("B", j - warm)]
        order += [("B", j) for j in range(m - warm, m)]
    for kind, j in order:
        (fwd if kind == "F" else bwd)(j)
    for h in pending:
        h.wait()


def _mesh(group):
    """A one-dimensional device mesh over the CPU ranks of ``group`` (FSDP2's data-parallel mesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if group is not None:
        return DeviceMesh.from_group(group, "cpu")
    return DeviceMesh("cpu", list(range(dist.get_world_size())))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(run: Run, warmup: int, repeats: int) -> dict:
    """``wall``: the slowest rank's seconds of each timed step of ``run``; ``cpu``: each rank's CPU seconds (user
    and system, every thread of the process) of each step."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "times.json")
        if run.world == 1:
            worker(0, run, 0, out, warmup, repeats)
        else:
            mp.start_processes(worker, args=(run, _free_port(), out, warmup, repeats), nprocs=run.world,
                               start_method="spawn")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def _count_command(run: Run, config: str, profile: str, expert_load: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "flopcount", "--hf", config, "--input-shape", f"input_ids={run.batch}x{SEQ}:int64",
           "--input-shape", f"labels={run.batch}x{SEQ}:int64", "--mode", "train", "--optimizer", "adamw",
           "--predict", "--machine", profile, "--format", "json"]
    if run.world > 1 or run.recompute != "none":
        cmd += ["--parallel", f"tp={run.tp},dp={run.dp},pp={run.pp}" + (",fsdp" if run.fsdp else "")
                + (",sp" if run.sp else "") + (f",ep={run.ep}" if run.ep > 1 else "")
                + (f",cp={run.cp}" if run.cp > 1 else ""),
                "--microbatches", str(run.microbatches),
                "--schedule", run.schedule, "--recompute", run.recompute]
    if expert_load is not None:
        cmd += ["--expert-load", expert_load]
    return cmd


def predict(run: Run, folder: str, profile: str, expert_load: list | None = None) -> dict:
    """The count's prediction of ``run`` (a separate flopcount process); ``expert_load``: each MoE layer's tokens
    per routed expert in the real run (its ``measure``), given as ``--expert-load``."""
    config = os.path.join(folder, f"{run.model}.json")
    load = None
    if expert_load is not None:
        load = os.path.join(folder, f"{run.name}-expert-load.json")
        with open(load, "w", encoding="utf-8") as f:
            json.dump(expert_load, f)
    done = subprocess.run(_count_command(run, config, profile, load), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{run.name}: flopcount failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)["prediction"]


def calibrate(world: int, folder: str) -> str:
    path = os.path.join(folder, f"profile-{world}.json")
    subprocess.run([sys.executable, "-m", "flopcount", "calibrate", "--ranks", str(world), "--threads", "1", "-o",
                    path], check=True, capture_output=True)
    return path


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-a of two orders."""
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0)
    return 2 * s / (n * (n - 1)) if n > 1 else float("nan")



def plan_picks(runs: list[Run], rows: list[dict]) -> list[str]:
    """For each rank count with two or more Llama runs (plans of the same model on the same processes): the run
    the prediction ranks fastest by tokens a second against the run measured fastest, and how far the picked run's
    measured tokens a second fall below the fastest's (the issue's target: within 5%), by the wall clock and by the
    busy CPU time."""
    out = []
    by_world: dict[int, list[tuple[Run, dict]]] = {}
    for run, row in zip(runs, rows):
        if run.model == "llama":
            by_world.setdefault(run.world, []).append((run, row))
    for world, group in sorted(by_world.items()):
        if len(group) < 2:
            continue
        for measured_key, predicted_key, what in (("measured_s", "predicted_s", "wall clock"),
                                                  ("cpu_s", "predicted_busy_s", "busy CPU time")):
            def tokens_per_s(run: Run, row: dict, key: str) -> float:
                return run.batch * run.microbatches * run.dp * SEQ / row[key]

            picked = max(group, key=lambda g: tokens_per_s(*g, predicted_key))
            best = max(group, key=lambda g: tokens_per_s(*g, measured_key))
            short = 1 - tokens_per_s(*picked, measured_key) / tokens_per_s(*best, measured_key)
            out.append(f"{world} ranks, {len(group)} plans, {what}: predicted fastest {picked[0].name}, measured "
                       f"fastest {best[0].name}; the pick's measured tokens/s {short:.1%} below the fastest's")
    return out


def _end(v) -> str:
    """An end of the predicted interval (None: not known, the prediction's interval_note says why)."""
    return "?" if v is None else f"{v:.3f}"


def _timed(run: Run, args, folder: str, profile: str) -> dict:
    """One pass of ``run``: measured, then predicted from ``profile`` (the busiest rank's busy seconds as the
    prediction counts them: :func:`flopcount.measure.predict.busy_seconds`)."""
    from flopcount.measure.predict import busy_seconds

    load0 = os.getloadavg()[0]
    got = measure(run, args.warmup, args.repeats)
    load1 = os.getloadavg()[0]
    pred = predict(run, folder, profile, got.get("expert_load"))  # the run's routing under ep
    times = got["wall"]
    med = statistics.median(times)
    cpu = max(statistics.median(c) for c in got["cpu"])
    busy = max(busy_seconds(r) for r in pred["ranks"])
    return {"run": run.name, "measured_s": med, "fastest_s": min(times), "slowest_s": max(times),
            "predicted_s": pred["step_seconds"], "interval": pred["interval"], "error": pred["step_seconds"] / med - 1,
            "cpu_s": cpu, "predicted_busy_s": busy, "cpu_error": busy / cpu - 1,
            "predicted_overhead_s": max(r.get("overhead_seconds", 0.0) for r in pred["ranks"]),
            "load": [load0, load1]}


def _over_passes(rows: list[dict]) -> dict:
    """One run's passes as one row: the medians of its measured and predicted figures over the passes (the errors
    theirs), the fastest and slowest step of any pass, the widest interval, the spread between the passes' medians
    (``between_passes``: the slowest over the fastest, less 1), and each pass's row."""
    med = {k: statistics.median(r[k] for r in rows) for k in ("measured_s", "predicted_s", "cpu_s", "predicted_busy_s",
                                                              "predicted_overhead_s")}
    lows, highs = [r["interval"][0] for r in rows], [r["interval"][1] for r in rows]
    return {"run": rows[0]["run"], **med, "fastest_s": min(r["fastest_s"] for r in rows),
            "slowest_s": max(r["slowest_s"] for r in rows),
            "interval": [None if None in lows else min(lows), None if None in highs else max(highs)],
            "error": med["predicted_s"] / med["measured_s"] - 1,
            "cpu_error": med["predicted_busy_s"] / med["cpu_s"] - 1,
            "load": [min(r["load"][0] for r in rows), max(r["load"][1] for r in rows)],
            "between_passes": max(r["measured_s"] for r in rows) / min(r["measured_s"] for r in rows) - 1,
            "passes": rows}


def _print_row(row: dict, prefix: str) -> None:
    between = (f", between passes {row['between_passes']:4.0%}" if "between_passes" in row else "")
    print(f"{prefix}{row['run']:26s} wall {row['measured_s']:7.4f} s (spread "
          f"{row['slowest_s'] / row['fastest_s'] - 1:4.0%}{between}, load {row['load'][0]:.1f}-{row['load'][1]:.1f}) "
          f"predicted {row['predicted_s']:7.4f} s [{_end(row['interval'][0])}, {_end(row['interval'][1])}] error "
          f"{row['error']:+6.1%} | busy CPU {row['cpu_s']:7.4f} s predicted {row['predicted_busy_s']:7.4f} s error "
          f"{row['cpu_error']:+6.1%} (framework overhead {row['predicted_overhead_s']:.4f} s of it)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="comma-separated run names (default: all): " + ", ".join(r.name for r in RUNS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profiles", help="a folder of profile-W.json already calibrated (default: calibrate now)")
    ap.add_argument("--passes", type=int, default=1,
                    help="time every run this many times, one pass of all the runs after another, each pass with its "
                         "own profiles; each run's figures are then the medians over the passes, beside the spread "
                         "between them")
    ap.add_argument("-o", "--output", help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error(f"--passes {args.passes}: give 1 or more")
    # the runs of each rank count together, their profile calibrated just before them (in its own process): this
    # shared machine's speed drifts by up to a fifth over hours, and by several percent over minutes
    runs = sorted((r for r in RUNS if not args.runs or r.name in args.runs.split(",")), key=lambda r: r.world)
    folder = tempfile.mkdtemp(prefix="flopcount-step-time-")
    for name, cfg in MODELS.items():
        with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f)
    passes = []
    for k in range(args.passes):
        profiles, rows = {}, []
        for run in runs:
            if run.world not in profiles:
                profiles[run.world] = (os.path.join(args.profiles, f"profile-{run.world}.json") if args.profiles
                                       else calibrate(run.world, folder))
            rows.append(_timed(run, args, folder, profiles[run.world]))
            _print_row(rows[-1], f"pass {k + 1}/{args.passes} " if args.passes > 1 else "")
        passes.append(rows)
    rows = passes[0] if args.passes == 1 else [_over_passes(list(rs)) for rs in zip(*passes)]
    if args.passes > 1:
        print(f"over the {args.passes} passes (medians; between passes: the slowest pass's median over the "
              "fastest's, less 1):")
        for row in rows:
            _print_row(row, "")
    for key, what in (("error", "wall clock"), ("cpu_error", "busy CPU time")):
        errs = [abs(r[key]) for r in rows]
        measured = [r["measured_s" if key == "error" else "cpu_s"] for r in rows]
        predicted = [r["predicted_s" if key == "error" else "predicted_busy_s"] for r in rows]
        print(f"{what}: runs {len(rows)}, mean |error| {statistics.mean(errs):.1%}, worst {max(errs):.1%}, "
              f"Kendall tau {kendall_tau(measured, predicted):.3f}")
    for line in plan_picks(runs, rows):
        print(line)
    errs = [abs(r["error"]) for r in rows]
    tau = kendall_tau([r["measured_s"] for r in rows], [r["predicted_s"] for r in rows])
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump({"runs": rows, "mean_abs_error": statistics.mean(errs), "worst": max(errs), "tau": tau,
                       "plan_picks": plan_picks(runs, rows), "passes": args.passes}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
