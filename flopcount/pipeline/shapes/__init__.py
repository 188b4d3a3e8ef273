"""Shape resolution: user overrides, ONNX shape inference with data propagation, and evaluation of
the small integer subgraphs that compute shapes.

ONNX's own inference resolves static graphs in one pass. Exported graphs often compute Reshape
targets or ConstantOfShape sizes at run time (``Shape → Gather → Concat → Reshape``, ``Range``,
``Where(Equal(...))``); when dims remain unknown, :func:`resolve` evaluates every node whose inputs
are known small constants (shape vectors, never weights), turns the results into initializers of a
scratch copy and infers again, until nothing new resolves.

The package, by job (each module imports only those listed after it):

* :mod:`.resolution` :func:`resolve` and its :class:`Resolution`: the rounds of inference and folding
* :mod:`.contrib` shapes around operators of other domains (twins, registered shape functions, onnxruntime's)
* :mod:`.bodies` shapes inside If / Loop / Scan bodies, and of Loop outputs
* :mod:`.guarded` ONNX's inference, guarded: in a forked child or a spawned interpreter, depth by depth, dims checked
* :mod:`.shape_constants` shape constants asking for more than 2**48 elements, refused before inference
* :mod:`.overrides` what the user fixes first: input shapes, batch, input values
* :mod:`.interpreter` a small numpy interpreter that folds the constant subgraphs computing shapes
* :mod:`.tensors` tensor infos read from a model, and the limits and operator sets shared by the rest
"""

from .contrib import SHAPE_TWINS, symbolic_inference
from .guarded import DATA_PROP_LIMIT, PARALLEL_MIN_NODES, Inference, check_dims, data_prop_bounded
from .interpreter import evaluate_node
from .overrides import apply_overrides, apply_values, parse_dims, prepare, real_inputs
from .resolution import MAX_ROUNDS, Resolution, resolve
from .tensors import FOLD_LIMIT, MAX_ELEMENTS, initializer_infos

__all__ = [
    "DATA_PROP_LIMIT", "FOLD_LIMIT", "MAX_ELEMENTS", "MAX_ROUNDS", "PARALLEL_MIN_NODES", "SHAPE_TWINS", "Inference",
    "Resolution", "apply_overrides", "apply_values", "check_dims", "data_prop_bounded", "evaluate_node",
    "initializer_infos", "parse_dims", "prepare", "real_inputs", "resolve", "symbolic_inference",
]
