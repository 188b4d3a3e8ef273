"""The measuring half of flopcount: analytic counts turned into measured performance of real runs.

It reads the counting :class:`flopcount.Report` and never reaches into counting internals. Heavy libraries
(torch, NVML, onnxruntime, matplotlib) are imported inside the functions that need them. Four rooms, whose imports
run one way (``harness`` → ``machine``; ``profile`` → ``machine``; ``ncu`` stands alone; see docs/architecture.md):

* :mod:`.harness` the training harness: the meter, its clocks, energy, MFU, the run record and the bench report
* :mod:`.machine` the machine: devices and their peaks, the system under test, measured ceilings
* :mod:`.profile` per-node onnxruntime times beside counted FLOPs and bytes, and the rooflines
* :mod:`.ncu` Nsight Compute exports parsed, and the count beside the hardware counters
* :mod:`.predict` (with :mod:`.predict_report`) the step time per rank predicted from a count and a machine profile
  (``--predict``; it reads :mod:`.machine`'s profile and the core's per-rank ledger); :mod:`.plan_search` every plan
  of N devices ranked by it (``flopcount plan``)
* :mod:`.plan_space` the plans of N devices enumerated (arithmetic on the degrees), for :mod:`.plan_search`
* :mod:`.predict_messages` the collectives a plan's rank runs in a step, as the predictor's messages, for
  :mod:`.predict_report`

Which room to open for a figure of a bench report (``flopcount bench``, ``Meter.to_json``):

* ``samples_per_s`` (with ``end_to_end``), ``tokens_per_s``, ``flops_per_token``, ``notes``, ``steps``, ``wall_s``, ``step_time_s``, ``per_rank``: :mod:`.harness.meter` (timed windows, via
  :mod:`.harness.clocks`); the arithmetic that forms them: :mod:`.harness.figures`
* ``flops``, ``flops_per_sample``, ``vflops``, ``flops_epoch_form``, ``quality``, ``time_to_quality_s``:
  :mod:`.harness.figures` (C from the counting report)
* ``mfu``, ``hfu``: :mod:`.harness.figures`, over the effective peak and ``precision`` of :mod:`.harness.mfu`;
  ``peak_flops``, ``peak_source``: :mod:`.machine.devices` (vendor table) or :mod:`.machine.ceilings` (a CPU's
  measured GEMM ceiling)
* ``energy_j``, ``power_w``, ``flops_per_watt``: :mod:`.harness.energy` (RAPL, NVML)
* ``communication``: :mod:`.harness.distributed`; ``ensemble``: :mod:`.harness.ensemble`; ranks: :mod:`.harness.ranks`
* the argument checks of the meter and callbacks: :mod:`.harness.checks`
* ``summary`` (olympic mean, variation) and the JSON schema: :mod:`.harness.result`; the table: :mod:`.harness.run_table`
* ``system`` (CPU, GPUs, memory, software, topology): :mod:`.machine.system`
* the MLPerf log of ``--mllog`` (the checker's training ruleset 4.0.0): :mod:`.harness.mllog`
* ``config`` (the workload, its counting and scale-out settings): :mod:`flopcount.workloads` and
  :mod:`flopcount.cli.bench`

One module stands beside the rooms: :mod:`.ncu_step`, the command ``python -m flopcount.measure.ncu_step`` that
``flopcount crosscheck`` prints and runs under ncu (a door for users that hands over to :mod:`flopcount.cli.ncu_step`).
"""

__all__: list[str] = []
