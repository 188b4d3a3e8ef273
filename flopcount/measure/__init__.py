"""The measuring half of flopcount: analytic counts turned into measured performance of real runs.

It reads the counting :class:`flopcount.Report` and never reaches into counting internals. Heavy libraries
(torch, NVML, onnxruntime, matplotlib) are imported inside the functions that need them.

* :mod:`.devices` which device runs the work and its dense peak per dtype (vendor table, or measured on a CPU)
* :mod:`.ceilings` measured GEMM, convolution, memory and all-reduce ceilings of this machine
* :mod:`.profile` per-node time and FLOP/s of an ONNX model through onnxruntime's profiler
* :mod:`.roofline` the HPC-AI and per-operator rooflines and their plots
* :mod:`.system` the system under test, for reports
* :mod:`.distributed` torchrun/srun process groups, DDP with measured gradient communication, sharded epochs
* :mod:`.ensemble` HPC AI500 V3.0 bagging ensembles: M base models x P ranks, bootstrap samples, averaged predictions
"""
