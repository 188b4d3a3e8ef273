"""FLOPs per rank under a parallel plan. It imports the report records (:mod:`flopcount.reporting`) and the contract.

* :mod:`.plan` the parallel plan and recompute policy, frozen records with their parsing
* :mod:`.layout` the model's layout under a plan, read once from the graph: the repeated layers and each part's role
  (column, row, vocab, heads, sequence, replicated, expert), the split rules, stages, rank id and warm-up
* :mod:`.stacks` a model of two or more stacks (an encoder-decoder): its plans, where the nodes between its stacks
  run, and what a pipeline sends between its stages
* :mod:`.roles` the parts' roles read off the graph's dataflow (attention and MLP projections, embedding, LM head)
* :mod:`.ranks` FLOPs, redundant work, communication bytes and the bubble per rank under a plan (``--parallel``)
* :mod:`.calls_tp` tensor parallelism's collectives as calls (size, count, phase), the ledger's TP bytes their sums
* :mod:`.schedules` the pipeline schedules simulated action by action (GPipe, 1F1B, interleaved 1F1B)
* :mod:`.experts` the context- and expert-parallel rules (zigzag CP, EP over dp·cp, ``--expert-load``)
* :mod:`.optimizer` the optimizer step's FLOPs per rank: the parameter elements each rank updates
* :mod:`.generation` FLOPs per rank of generation (``--generate P:N --parallel``): prefill and decode steps
"""

__all__: list[str] = []
