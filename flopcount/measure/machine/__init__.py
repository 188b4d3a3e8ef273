"""The machine: which device runs the work and its peak, the system under test, and measured ceilings.

Describing a device never starts a measurement: a CPU's measured peak is passed into its description
(:func:`.ceilings.measured_cpu_device`). Imports run ``ceilings`` → ``system`` → ``devices``.

* :mod:`.devices` devices and their dense peak per dtype (vendor table for GPUs; a CPU's peak given to it)
* :mod:`.system` the system under test, for reports
* :mod:`.ceilings` measured GEMM, convolution, memory and all-reduce ceilings of this machine (cached per machine)
* :mod:`.calibration` machine profiles for ``--predict``: the record, its checks, the datasheet profiles
* :mod:`.calibrate` ``flopcount calibrate``: a machine profile measured in spawned gloo processes
"""

from .ceilings import Ceilings, load_ceilings, measure_ceilings, measured_cpu_device
from .devices import Device, Peak, describe
from .system import describe_system

__all__ = ["Ceilings", "Device", "Peak", "describe", "describe_system", "load_ceilings", "measure_ceilings",
           "measured_cpu_device"]
