"""The training harness: a :class:`Meter` around a training loop, and the run's figures as a :class:`RunResult`.

* :mod:`.meter` the meter: steps, timed windows, quality points, energy windows; hands a snapshot to :mod:`.figures`
* :mod:`.figures` the run's figures as a pure function of a frozen :class:`~.figures.RunSnapshot`
* :mod:`.clocks` step timers: host clock, CUDA events
* :mod:`.energy` energy sources: RAPL on a CPU, NVML on a GPU
* :mod:`.mfu` the precision of a run and the effective peak that MFU divides by
* :mod:`.result` the run record, the bench report and its repeat-run statistics (JSON schema)
* :mod:`.run_table` the text tables of a run and of a bench report
* :mod:`.mllog` MLPerf-style ``:::MLLOG`` lines
* :mod:`.ranks` this process's rank under torch.distributed, figures gathered from every rank
* :mod:`.distributed` torchrun/srun process groups, DDP with measured gradient communication, sharded epochs
* :mod:`.ensemble` HPC AI500 V3.0 bagging ensembles: M base models x P ranks, bootstrap samples, averaged predictions
* :mod:`.callbacks` the meter inside Lightning's ``Trainer`` and Keras's ``fit``
* :mod:`.predicted` the step predicted on a machine profile (``machine=``) beside the measured one

The workloads that ``flopcount bench`` trains stay in :mod:`flopcount.workloads`: they build models
(:mod:`flopcount.models`) and data sets and drive a meter, so they stand above the harness, never inside it.
"""

from .meter import Meter
from .result import RunResult

__all__ = ["Meter", "RunResult"]
