"""The ONNX pipeline, in the order a count runs through it. It imports only the formula contract at the top of the
package (context, registry, masks, errors).

* :mod:`.loading` reads a model without its weights (:func:`~flopcount.pipeline.loading.load_with_weights` with them)
* :mod:`.graph` the node DAG and its frozen :class:`~flopcount.pipeline.graph.GraphIndex`;
  :func:`~flopcount.pipeline.graph.walk_graphs`
* :mod:`.validate` checks the graph and the resolved shapes
* :mod:`.attributes` the nodes' attributes as values for their formulas, schema defaults filled in
* :mod:`.shapes` shape resolution (a package: overrides, guarded inference, the numpy interpreter, bodies)
* :mod:`.graph_masks` the attention masks a graph computes from positions, evaluated for ``--attention executed``
* :mod:`.parameters` which stored tensors are parameters, buffers or constants
* :mod:`.schema` the operator-schema queries (differentiable inputs) that several stages share
* :mod:`.gradients` which tensors need a gradient in a training count (the gradient plan)
* :mod:`.progress` the phases of long work, reported on a logger while they run
* :mod:`.retained` a count's working state held until a process that ends without teardown ends
* :mod:`.onnx_cases` ONNX's own single-node test cases, for the inventory of operators
"""

__all__: list[str] = []
