"""GPU facts behind one small interface: NVML, a simulation, or none (with the reason)."""

import os

from resourced.protocol.time import SIMULATION_VARIABLE

from .base import Backend, BackendError, GpuLoad, GpuProcess, NoGpus

__all__ = ["SIMULATION_VARIABLE", "Backend", "BackendError", "GpuLoad", "GpuProcess", "NoGpus",
           "select_backend"]


def select_backend(environ=os.environ) -> Backend:
    """The simulation when RESOURCED_SIMULATED_GPUS is set, else NVML, else no GPUs."""
    simulated = environ.get(SIMULATION_VARIABLE)
    if simulated:
        from .simulated import SimulatedBackend

        return SimulatedBackend.from_setting(simulated)
    from .nvml import NvmlBackend

    try:
        return NvmlBackend.open()
    except BackendError as exc:
        return NoGpus(f"NVML is not usable ({exc}) and {SIMULATION_VARIABLE} is not set")
