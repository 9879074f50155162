"""NVIDIA GPUs through NVML (the nvidia-ml-py package, imported as pynvml)."""

from contextlib import contextmanager

from resourced.core.inventory import Gpu

from .base import BackendError, GpuLoad, GpuProcess


@contextmanager
def nvml_errors():
    """Translate NVML's exceptions into BackendError, the one error backends raise."""
    import pynvml

    # NVMLLibraryMismatchError (a driver older than the bindings) is no NVMLError, and
    # older bindings do not define it.
    errors = (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError))
    try:
        yield pynvml
    except errors as exc:
        raise BackendError(f"NVML: {exc}") from exc


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"
    blocking = True

    def __init__(self, handles: list):
        self._handles = handles  # cached device handles, in NVML index order

    @classmethod
    def open(cls) -> "NvmlBackend":
        """Initialise NVML once and cache the device handles."""
        try:
            import pynvml  # noqa: F401
        except ImportError as exc:
            raise BackendError("the nvidia-ml-py package is not installed") from exc
        with nvml_errors() as nv:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            return cls([nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)])

    def inventory(self) -> list[Gpu]:
        gpus = []
        with nvml_errors() as nv:
            for index, h in enumerate(self._handles):
                gpus.append(
                    Gpu(
                        index=index,
                        uuid=_text(nv.nvmlDeviceGetUUID(h)),
                        name=_text(nv.nvmlDeviceGetName(h)),
                        memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                        pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
                        minor=int(nv.nvmlDeviceGetMinorNumber(h)),
                    )
                )
        return gpus

    def load(self) -> dict[str, GpuLoad]:
        found = {}
        with nvml_errors() as nv:
            for h in self._handles:
                found[_text(nv.nvmlDeviceGetUUID(h))] = GpuLoad(
                    int(nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    int(nv.nvmlDeviceGetMemoryInfo(h).used))
        return found

    def processes(self) -> dict[str, list[GpuProcess]]:
        found = {}
        with nvml_errors() as nv:
            for h in self._handles:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
                found[_text(nv.nvmlDeviceGetUUID(h))] = [
                    GpuProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs
                ]
        return found
