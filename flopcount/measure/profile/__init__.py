"""Measured time and FLOP/s per operator through onnxruntime's profiler, and the rooflines.

* :mod:`.profiler` :func:`profile`: count, run, time and attribute; the one entry point
* :mod:`.runnable` the model onnxruntime runs (weights read or synthesised, nodes named) and its inputs
* :mod:`.session` onnxruntime: provider, session, one run, the profiler's trace parsed
* :mod:`.attribution` executed nodes → the graph nodes they run; bytes of a group; compute- or memory-bound
* :mod:`.records` the :class:`Profile` record and its JSON, table and CSV forms
* :mod:`.roofline` the HPC-AI and per-operator rooflines and their plots
* :mod:`.modules` measured time per module: the count's HTML page with the profile's times
"""

from .attribution import attribute, bound_of
from .profiler import ProfileSettings, profile
from .records import PROFILE_SCHEMA_VERSION, NodeProfile, OpTypeProfile, Profile, render, to_dict
from .runnable import make_inputs, runnable_model
from .session import OPTIMIZE_LEVELS, PROVIDERS, parse_profile

__all__ = ["OPTIMIZE_LEVELS", "PROFILE_SCHEMA_VERSION", "PROVIDERS", "NodeProfile", "OpTypeProfile", "Profile",
           "ProfileSettings", "attribute", "bound_of", "make_inputs", "parse_profile", "profile", "render", "runnable_model", "to_dict"]
