"""onnx's own single-node test cases (``onnx.backend.test.case.node``) as counting inputs."""

from __future__ import annotations

import numpy as np


def run_time_facts(case) -> tuple[dict, dict, dict]:
    """What a user must supply for a test case's facts that only exist at run time, read from its
    data: values of small inputs that shapes depend on (axes, sizes, window lengths), and sequence
    lengths and element shapes. Returns ``(input_values, input_shapes, loop_trips)``."""
    m = case.model
    initialized = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in initialized]
    feeds = case.data_sets[0][0] if case.data_sets else []
    values, shapes, trips = {}, {}, {}
    for vi, data in zip(inputs, feeds):
        if isinstance(data, list):  # a sequence input
            if data and isinstance(data[0], np.ndarray):
                shapes[vi.name] = data[0].shape
            for i, n in enumerate(m.graph.node):
                if n.op_type in ("Loop", "SequenceMap"):
                    trips[n.name or f"{n.op_type}_{i}"] = len(data)
            continue
        if isinstance(data, (np.ndarray, np.generic)):
            arr = np.asarray(data)
            if arr.size <= 16 and arr.dtype.kind in "iufV" and vi.type.HasField("tensor_type"):
                values[vi.name] = arr
    return values, shapes, trips
