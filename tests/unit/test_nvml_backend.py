"""The NVML backend against recorded NVML answers: pynvml's functions are monkeypatched,
so no driver or GPU is needed.  The answers are pynvml's own types (ctypes structures,
``nvmlFriendlyObject``), as a real driver returns them."""

import asyncio
import inspect

import pynvml
import pytest

from resourced.backends import BackendError, GpuProcess, NoGpus, select_backend
from resourced.backends.nvml import NvmlBackend, nvml_errors
from resourced.core.inventory import Gpu
from resourced.evidence.gpuprobe import GpuProbe

MIB = 1024 * 1024

# What two H100s answered (UUIDs and bus ids shortened to stay readable).
RECORDED = [
    {"uuid": "GPU-8f6b2c1e-0d4a-4f7e-9c3b-2a1d5e6f7a8b", "name": "NVIDIA H100 80GB HBM3",
     "total": 81559 * MIB, "used": 1024 * MIB, "bus_id": b"00000000:19:00.0",
     "processes": [(4242, 1000 * MIB), (4300, None)], "minor": 2},
    {"uuid": "GPU-1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "name": "NVIDIA H100 80GB HBM3",
     "total": 81559 * MIB, "used": 0, "bus_id": b"00000000:3B:00.0", "processes": [],
     "minor": 0},
]


class Handle:
    """Stands for a c_nvmlDevice_t: opaque, only ever handed back to NVML."""

    def __init__(self, index: int):
        self.index = index


def process_info(pid: int, used: int | None):
    """What nvmlDeviceGetComputeRunningProcesses returns for one process."""
    raw = pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=0, gpuInstanceId=0xFFFFFFFF,
                                        computeInstanceId=0xFFFFFFFF)
    obj = pynvml.nvmlStructToFriendlyObject(raw)
    obj.usedGpuMemory = used  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
    return obj


class FakeNvml:
    """Recorded answers behind pynvml's function names, counting every call."""

    FUNCTIONS = ("nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                 "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
                 "nvmlDeviceGetPciInfo", "nvmlDeviceGetComputeRunningProcesses",
                 "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMinorNumber")

    def __init__(self, monkeypatch, gpus=RECORDED, as_bytes=False):
        self.gpus = [dict(g) for g in gpus]
        self.as_bytes = as_bytes
        self.calls = {name: 0 for name in self.FUNCTIONS}
        self.failures: dict[tuple[str, int | None], BaseException] = {}
        for name in self.FUNCTIONS:
            monkeypatch.setattr(pynvml, name, self._counted(name, getattr(self, "_" + name)))

    def fail(self, function: str, error: BaseException, index: int | None = None) -> None:
        """Make ``function`` raise ``error`` (for one GPU's handle, or always)."""
        self.failures[(function, index)] = error

    def _counted(self, name, fn):
        def call(*args):
            self.calls[name] += 1
            index = args[0].index if args and isinstance(args[0], Handle) else None
            for key in ((name, index), (name, None)):
                if key in self.failures:
                    raise self.failures[key]
            return fn(*args)

        call.__signature__ = inspect.signature(fn)
        return call

    def _text(self, value: str):
        return value.encode() if self.as_bytes else value

    def _nvmlInit(self):
        return None

    def _nvmlDeviceGetCount(self):
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    def _nvmlDeviceGetUUID(self, h):
        return self._text(self.gpus[h.index]["uuid"])

    def _nvmlDeviceGetName(self, h):
        return self._text(self.gpus[h.index]["name"])

    def _nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self.gpus[h.index]
        return pynvml.c_nvmlMemory_t(total=g["total"], free=g["total"] - g["used"],
                                     used=g["used"])

    def _nvmlDeviceGetPciInfo(self, h):
        g = self.gpus[h.index]
        bus = int(g["bus_id"].split(b":")[1], 16)
        return pynvml.nvmlPciInfo_t(busIdLegacy=g["bus_id"], domain=0, bus=bus, device=0,
                                    pciDeviceId=0x233010DE, pciSubSystemId=0x16C110DE,
                                    busId=g["bus_id"])

    def _nvmlDeviceGetMinorNumber(self, h):
        return self.gpus[h.index]["minor"]

    def _nvmlDeviceGetUtilizationRates(self, h):
        return pynvml.c_nvmlUtilization_t(gpu=self.gpus[h.index].get("util", 0), memory=0)

    def _nvmlDeviceGetComputeRunningProcesses(self, h):
        return [process_info(pid, used) for pid, used in self.gpus[h.index]["processes"]]


@pytest.fixture
def nvml(monkeypatch) -> FakeNvml:
    return FakeNvml(monkeypatch)


def expected_inventory() -> list[Gpu]:
    return [Gpu(index=i, uuid=g["uuid"], name=g["name"], memory_bytes=g["total"],
                pci_bus_id=g["bus_id"].decode(), minor=g["minor"])
            for i, g in enumerate(RECORDED)]


EXPECTED_PROCESSES = {
    RECORDED[0]["uuid"]: [GpuProcess(4242, 1000 * MIB), GpuProcess(4300, 0)],
    RECORDED[1]["uuid"]: [],
}


# -- answers ------------------------------------------------------------------------------


def test_inventory_reports_each_gpu_in_nvml_index_order(nvml):
    assert NvmlBackend.open().inventory() == expected_inventory()


# What an H200 answered (recorded through the device tool, 2026-11-30): a process of ours
# holding a 4 GiB allocation through the CUDA driver API while memsets ran, which the
# driver counted at 0 % utilisation (a process at 0 % is still use, for no-shows).
H200 = {"uuid": "GPU-a7d00f32-64fa-041e-83fb-5546b548f523", "name": "NVIDIA H200",
        "total": 150754820096, "used": 5237 * MIB, "bus_id": b"00000000:00:06.0",
        "processes": [(457, 4838129664)], "util": 0}


def test_load_is_utilisation_and_memory_in_use_per_gpu(monkeypatch):
    from resourced.backends import GpuLoad

    FakeNvml(monkeypatch, gpus=[H200, {**RECORDED[1], "util": 87}])
    backend = NvmlBackend.open()
    assert backend.load() == {H200["uuid"]: GpuLoad(0, 5237 * MIB),
                              RECORDED[1]["uuid"]: GpuLoad(87, 0)}
    assert backend.processes() == {H200["uuid"]: [GpuProcess(457, 4838129664)],
                                   RECORDED[1]["uuid"]: []}


def test_processes_map_each_uuid_to_its_compute_processes(nvml):
    backend = NvmlBackend.open()
    assert backend.name == "nvml"
    assert backend.processes() == EXPECTED_PROCESSES


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_uuids_and_names_as_bytes_or_str_give_the_same_text(monkeypatch, as_bytes):
    """Older nvidia-ml-py returned bytes; newer decodes them. Either way we get str."""
    FakeNvml(monkeypatch, as_bytes=as_bytes)
    backend = NvmlBackend.open()
    inventory = backend.inventory()
    assert inventory == expected_inventory()
    assert all(isinstance(g.uuid, str) and isinstance(g.name, str) for g in inventory)
    assert backend.processes() == EXPECTED_PROCESSES


def test_unavailable_used_memory_counts_as_zero(monkeypatch):
    gpus = [{**RECORDED[0], "processes": [(7, None), (8, 0), (9, 5 * MIB)]}]
    FakeNvml(monkeypatch, gpus=gpus)
    assert NvmlBackend.open().processes() == {
        RECORDED[0]["uuid"]: [GpuProcess(7, 0), GpuProcess(8, 0), GpuProcess(9, 5 * MIB)]}


def test_no_gpus_is_an_empty_inventory(monkeypatch):
    FakeNvml(monkeypatch, gpus=[])
    backend = NvmlBackend.open()
    assert (backend.inventory(), backend.processes()) == ([], {})


def test_nvml_is_initialised_once_and_handles_are_cached(nvml):
    backend = NvmlBackend.open()
    assert (nvml.calls["nvmlInit"], nvml.calls["nvmlDeviceGetCount"],
            nvml.calls["nvmlDeviceGetHandleByIndex"]) == (1, 1, len(RECORDED))
    for _ in range(3):
        backend.inventory()
        backend.processes()
    assert (nvml.calls["nvmlInit"], nvml.calls["nvmlDeviceGetCount"],
            nvml.calls["nvmlDeviceGetHandleByIndex"]) == (1, 1, len(RECORDED))
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 3 * len(RECORDED)


def test_select_backend_opens_nvml_without_a_simulation(nvml):
    backend = select_backend({})
    assert backend.name == "nvml"
    assert backend.inventory() == expected_inventory()
    assert nvml.calls["nvmlInit"] == 1


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("code, text", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
])
def test_no_driver_at_init_gives_no_gpus_with_the_reason(nvml, code, text):
    nvml.fail("nvmlInit", pynvml.NVMLError(code))
    with pytest.raises(BackendError, match=text) as caught:
        NvmlBackend.open()
    assert isinstance(caught.value.__cause__, pynvml.NVMLError)

    backend = select_backend({})
    assert isinstance(backend, NoGpus)
    assert text in backend.reason and "RESOURCED_SIMULATED_GPUS" in backend.reason
    assert (backend.inventory(), backend.processes()) == ([], {})


def test_the_real_pynvml_without_a_driver_gives_no_gpus():
    """No monkeypatching: on a machine without libnvidia-ml, NVML's own failure."""
    try:
        NvmlBackend.open()
    except BackendError:
        backend = select_backend({})
        assert isinstance(backend, NoGpus) and "NVML is not usable" in backend.reason
    else:
        pytest.skip("this machine has a working NVML")


@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceGetComputeRunningProcesses"])
def test_a_gpu_lost_during_a_sweep_is_a_backend_error(nvml, function):
    backend = NvmlBackend.open()
    nvml.fail(function, pynvml.NVMLError_GpuIsLost(), index=1)
    with pytest.raises(BackendError, match="GPU is lost") as caught:
        backend.processes()
    assert isinstance(caught.value.__cause__, pynvml.NVMLError_GpuIsLost)


@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceGetName",
                                      "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo"])
def test_a_gpu_lost_while_reading_the_inventory_is_a_backend_error(nvml, function):
    backend = NvmlBackend.open()
    nvml.fail(function, pynvml.NVMLError_GpuIsLost(), index=0)
    with pytest.raises(BackendError, match="GPU is lost"):
        backend.inventory()


def test_not_supported_is_a_backend_error(nvml):
    backend = NvmlBackend.open()
    nvml.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_NotSupported())
    with pytest.raises(BackendError, match="Not Supported") as caught:
        backend.processes()
    assert isinstance(caught.value.__cause__, pynvml.NVMLError_NotSupported)


@pytest.mark.parametrize("function", ["nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"])
def test_a_failure_after_init_makes_open_fail(nvml, function):
    nvml.fail(function, pynvml.NVMLError_Unknown())
    with pytest.raises(BackendError, match="Unknown Error"):
        NvmlBackend.open()
    assert isinstance(select_backend({}), NoGpus)


def test_a_lost_gpu_makes_the_probe_answer_unknown_with_the_reason(nvml):
    probe = GpuProbe(NvmlBackend.open(), timeout=5)
    assert asyncio.run(probe.processes()).processes == EXPECTED_PROCESSES
    nvml.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_GpuIsLost())
    evidence = asyncio.run(probe.processes())
    assert not evidence.known
    assert evidence.reason == "NVML: GPU is lost"


# -- completeness: every NVML error has a target ------------------------------------------


def nvml_error_classes() -> list[type]:
    return sorted({obj for obj in vars(pynvml).values()
                   if isinstance(obj, type) and issubclass(obj, pynvml.NVMLError)},
                  key=lambda c: c.__name__)


def nvml_error_codes() -> list[int]:
    return sorted({v for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_")})


def test_pynvml_defines_an_error_class_per_code():
    classes = nvml_error_classes()
    assert len(classes) > 20  # the base and one subclass per NVML_ERROR_* code
    assert {pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_NotSupported,
            pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded} <= set(classes)


@pytest.mark.parametrize("cls", nvml_error_classes(), ids=lambda c: c.__name__)
def test_every_nvml_error_class_becomes_a_backend_error(cls):
    error = cls(pynvml.NVML_ERROR_UNKNOWN) if cls is pynvml.NVMLError else cls()
    with pytest.raises(BackendError) as caught:
        with nvml_errors():
            raise error
    assert caught.value.__cause__ is error
    assert str(caught.value).startswith("NVML: ")


@pytest.mark.parametrize("code", nvml_error_codes())
def test_every_nvml_error_code_becomes_a_backend_error(code):
    with pytest.raises(BackendError) as caught:
        with nvml_errors():
            raise pynvml.NVMLError(code)
    assert caught.value.__cause__.value == code


def test_an_error_code_nvml_does_not_know_yet_becomes_a_backend_error(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlErrorString", lambda code: "Some Future Error")
    with pytest.raises(BackendError, match="Some Future Error"):
        with nvml_errors():
            raise pynvml.NVMLError(9999)


def pynvml_exception_classes() -> list[type]:
    """Every exception class pynvml itself defines, NVMLError's family or not."""
    return sorted({obj for obj in vars(pynvml).values()
                   if isinstance(obj, type) and issubclass(obj, Exception)
                   and obj.__module__ == pynvml.__name__}, key=lambda c: c.__name__)


def test_every_exception_pynvml_defines_becomes_a_backend_error():
    escaped = []
    for cls in pynvml_exception_classes():
        if cls is pynvml.NVMLError:
            error = cls(pynvml.NVML_ERROR_UNKNOWN)
        elif issubclass(cls, pynvml.NVMLError):  # one per code: older pynvml's take no value
            error = cls()
        else:
            error = cls("x")
        try:
            with nvml_errors():
                raise error
        except BackendError:
            continue
        except Exception:  # noqa: BLE001 - what escaped is the finding
            escaped.append(cls.__name__)
    assert escaped == []


def test_a_driver_too_old_for_pynvml_makes_the_probe_answer_unknown(nvml):
    probe = GpuProbe(NvmlBackend.open(), timeout=5)
    nvml.fail("nvmlDeviceGetComputeRunningProcesses",
              pynvml.NVMLLibraryMismatchError("Unversioned function called ..."))
    evidence = asyncio.run(probe.processes())
    assert not evidence.known and "Unversioned function" in evidence.reason
