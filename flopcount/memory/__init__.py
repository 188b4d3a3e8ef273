"""Memory from the graph. It imports :mod:`flopcount.parallel` (the plan, each node's share), the report records and
the contract.

* :mod:`.ledger` the memory ledger of one step: a liveness walk over a counted report's nodes (``--memory``)
* :mod:`.units` the recompute units: which nodes a policy runs again, grouped as a checkpoint wraps them
* :mod:`.tape` a liveness walk's record apart from the sizes, replayed at each rank's sizes (a plan search's
  ranks of one stage)
* :mod:`.counted` what a count hands the ledger, and its saved-for-backward rules applied before the walk
* :mod:`.experts` experts' weights stacked and gathered per token (a batched product's), read as the resident
  weights they are in the program that trains: no activations, each parameter's gradient its own
* :mod:`.layers` the memory ledger of L identical layers, walked on the 2-layer graph with its second layer copied
* :mod:`.ranks` the memory ledger per rank under a parallel plan (``--memory --parallel``)
* :mod:`.kv_ranks` the KV cache a rank of each stage holds under a plan (``--generate`` with ``--parallel``)
* :mod:`.rank_memo` what the per-rank walks of one graph keep for the next plan, and the keys of a rank's shares
* :mod:`.rank_graph` what a rank's walk finds once in a graph: the experts' nodes that carry their inner dimension
  (split over TP), the K and V gathered whole under cp, the storage a view shares
* :mod:`.summary` a plan's summary from its ledgers: the verdict against the device's memory, the MFU ceiling, the
  ranks grouped by the bytes they hold
* :mod:`.kernels` what the framework's kernels keep where the exporter wrote one kernel as several nodes (GELU, SiLU,
  rsqrt, fused attention), and torch's views and copies, applied before the ledger's walk
* :mod:`.cuda_sdpa` which kernel torch's CUDA dispatcher runs for a fused attention (flash, memory-efficient or
  math), and what it keeps besides Q, K, V and its output (``--memory-device cuda``)
* :mod:`.handed_masks` whether a fused attention kernel is handed the graph's mask, and what it keeps of it
* :mod:`.math_sdpa` sdpa's math path of a 16-bit query: what it keeps, in float32
* :mod:`.cpu_norms` torch's CPU layer norm of a 16-bit input: its statistics in the input's type
* :mod:`.promoted` the types torch's tensors have where the TorchScript exporter's sdpa promoted a 16-bit graph
  to float32
* :mod:`.sizes` a device's memory as users write it (``80GiB``, ``94GB``, bytes), for ``--device-memory``
* :mod:`.bodies` what one run of a control-flow body keeps for its backward (If, Loop, Scan, SequenceMap rules)
"""

__all__: list[str] = []
