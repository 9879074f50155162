"""The simulated GPU backend and the choice of backend, without any GPU or driver."""

import json
import sys
import types

import pytest

from resourced.backends import (
    SIMULATION_VARIABLE,
    BackendError,
    GpuProcess,
    NoGpus,
    select_backend,
)
from resourced.backends.simulated import (
    DEFAULT_MEMORY_MIB,
    MIB,
    SimulatedBackend,
    simulated_uuid,
)
from resourced.core.inventory import Gpu


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def default_gpu(index: int) -> Gpu:
    return Gpu(index=index, uuid=simulated_uuid(index), name="Simulated GPU",
               memory_bytes=DEFAULT_MEMORY_MIB * MIB,
               pci_bus_id=f"00000000:{index + 1:02x}:00.0", minor=index)


# -- a count -----------------------------------------------------------------------------


@pytest.mark.parametrize("setting, count", [("0", 0), ("1", 1), ("4", 4), (" 3 ", 3),
                                            ("16", 16)])
def test_a_count_gives_that_many_idle_default_gpus(setting, count):
    backend = SimulatedBackend.from_setting(setting)
    assert backend.name == "simulated"
    assert backend.inventory() == [default_gpu(i) for i in range(count)]
    assert backend.processes() == {simulated_uuid(i): [] for i in range(count)}


def test_simulated_uuids_are_distinct_and_gpu_like():
    uuids = {simulated_uuid(i) for i in range(100)}
    assert len(uuids) == 100
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)


def test_sixteen_gpus_get_hex_pci_bus_ids():
    [*_, last] = SimulatedBackend(count=16).inventory()
    assert last.pci_bus_id == "00000000:10:00.0"
    assert last.label == "gpu15"


# -- a JSON file -------------------------------------------------------------------------


def test_a_file_gives_its_gpus_with_defaults_for_what_is_missing(tmp_path):
    path = write(tmp_path / "gpus.json", {"gpus": [
        {"index": 0, "uuid": "GPU-aaaa", "name": "H100", "memory_total_mib": 1024,
         "pci_bus_id": "00000000:81:00.0", "minor": 5},
        {"index": 1},
    ]})
    backend = SimulatedBackend.from_setting(path)
    assert (backend.count, backend.path) == (None, path)
    assert backend.inventory() == [
        Gpu(index=0, uuid="GPU-aaaa", name="H100", memory_bytes=1024 * MIB,
            pci_bus_id="00000000:81:00.0", minor=5),
        default_gpu(1),
    ]


def test_an_empty_list_of_gpus_is_no_gpus(tmp_path):
    backend = SimulatedBackend(path=write(tmp_path / "g.json", {"gpus": []}))
    assert (backend.inventory(), backend.processes()) == ([], {})


def test_processes_map_each_gpu_uuid_to_its_processes(tmp_path):
    backend = SimulatedBackend(path=write(tmp_path / "g.json", {"gpus": [
        {"index": 0, "processes": [{"pid": 4242, "used_memory_mib": 1024}, {"pid": 7}]},
        {"index": 1, "uuid": "GPU-bbbb"},
        {"index": 2, "processes": []},
    ]}))
    assert backend.processes() == {
        simulated_uuid(0): [GpuProcess(4242, 1024 * MIB), GpuProcess(7, 0)],
        "GPU-bbbb": [],
        simulated_uuid(2): [],
    }


def test_the_file_is_read_again_on_every_call(tmp_path):
    path = tmp_path / "g.json"
    backend = SimulatedBackend(path=write(path, {"gpus": [{"index": 0}]}))
    assert backend.inventory() == [default_gpu(0)]
    assert backend.processes() == {simulated_uuid(0): []}

    write(path, {"gpus": [{"index": 0, "processes": [{"pid": 99}]}, {"index": 1}]})
    assert backend.inventory() == [default_gpu(0), default_gpu(1)]
    assert backend.processes() == {simulated_uuid(0): [GpuProcess(99)], simulated_uuid(1): []}

    write(path, {"gpus": []})
    assert backend.inventory() == []

    write(path, "{broken")
    with pytest.raises(BackendError):
        backend.inventory()

    write(path, {"gpus": [{"index": 3}]})
    assert backend.inventory() == [default_gpu(3)]


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{broken",
        "[1, 2",
        "null",
        "[]",
        '"gpus"',
        "{}",
        '{"gpu": []}',
        '{"gpus": {}}',
        '{"gpus": 4}',
        '{"gpus": null}',
    ],
)
def test_a_broken_file_is_a_backend_error(tmp_path, content):
    backend = SimulatedBackend(path=write(tmp_path / "g.json", content))
    with pytest.raises(BackendError, match="simulation file"):
        backend.inventory()
    with pytest.raises(BackendError):
        backend.processes()


def test_a_file_that_is_not_utf8_is_a_backend_error(tmp_path):
    path = tmp_path / "g.json"
    path.write_bytes(b'{"gpus": [{"index": 0, "name": "\xff"}]}')
    with pytest.raises(BackendError):
        SimulatedBackend(path=str(path)).inventory()


@pytest.mark.parametrize("setting", ["four", "absent.json", "4097"])
def test_a_setting_that_names_nothing_is_refused_naming_the_variable(tmp_path, setting):
    with pytest.raises(ValueError, match=f"RESOURCED_SIMULATED_GPUS={setting}: "):
        SimulatedBackend.from_setting(setting)


def test_a_file_removed_later_is_a_backend_error(tmp_path):
    path = tmp_path / "gone.json"
    path.write_text('{"gpus": []}')
    backend = SimulatedBackend.from_setting(str(path))
    path.unlink()
    with pytest.raises(BackendError, match="gone.json"):
        backend.inventory()


def test_a_directory_is_a_backend_error(tmp_path):
    with pytest.raises(BackendError):
        SimulatedBackend(path=str(tmp_path)).inventory()


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"uuid": "GPU-x"},
        {"index": "zero"},
        {"index": None},
        {"index": 0, "memory_total_mib": "lots"},
        {"index": 0, "memory_total_mib": None},
        4,
        "gpu0",
        None,
        [0],
    ],
)
def test_a_bad_entry_is_a_backend_error(tmp_path, entry):
    backend = SimulatedBackend(path=write(tmp_path / "g.json", {"gpus": [{"index": 0}, entry]}))
    with pytest.raises(BackendError, match="simulation entry"):
        backend.inventory()
    with pytest.raises(BackendError):
        backend.processes()


@pytest.mark.parametrize(
    "process",
    [{}, {"pid": "x"}, {"pid": 1, "used_memory_mib": "lots"}, 4242, None],
)
def test_a_bad_process_entry_is_a_backend_error(tmp_path, process):
    backend = SimulatedBackend(path=write(tmp_path / "g.json", {"gpus": [
        {"index": 0, "processes": [process]},
    ]}))
    with pytest.raises(BackendError):
        backend.processes()


def test_processes_come_from_one_reading_of_the_file(tmp_path, monkeypatch):
    from resourced.backends import simulated

    old = write(tmp_path / "old.json", {"gpus": [
        {"index": 0, "uuid": "GPU-old", "processes": [{"pid": 4242}]}]})
    new = write(tmp_path / "new.json", {"gpus": [{"index": 0, "uuid": "GPU-new"}]})
    versions = iter([old, new, new, new])  # the file is rewritten right after the first read
    monkeypatch.setattr(simulated, "open", lambda _p, *a, **k: open(next(versions), *a, **k),
                        raising=False)

    real = write(tmp_path / "gpus.json", {"gpus": []})  # what os.stat looks at
    result = SimulatedBackend(path=str(real)).processes()

    assert result in ({"GPU-old": [GpuProcess(4242)]}, {"GPU-new": []})


def test_the_file_is_parsed_again_only_when_it_changed(tmp_path, monkeypatch):
    from resourced.backends import simulated

    path = tmp_path / "gpus.json"
    write(path, {"gpus": [{"index": 0, "processes": [{"pid": 7}]}]})
    backend = SimulatedBackend(path=str(path))
    parsed = []
    real_load = simulated.json.load
    monkeypatch.setattr(simulated.json, "load", lambda f: parsed.append(1) or real_load(f))
    backend.processes()
    backend.processes()
    assert len(parsed) == 1
    write(path, {"gpus": [{"index": 0}, {"index": 1}]})  # a new version: read again
    assert len(backend.processes()) == 2 and len(parsed) == 2


# -- choosing a backend ------------------------------------------------------------------


def test_select_backend_takes_a_count_from_the_environment():
    backend = select_backend({SIMULATION_VARIABLE: "3"})
    assert isinstance(backend, SimulatedBackend)
    assert backend.inventory() == [default_gpu(i) for i in range(3)]


def test_select_backend_takes_a_file_from_the_environment(tmp_path):
    path = write(tmp_path / "g.json", {"gpus": [{"index": 5}]})
    backend = select_backend({SIMULATION_VARIABLE: path})
    assert isinstance(backend, SimulatedBackend)
    assert backend.inventory() == [default_gpu(5)]


def test_select_backend_defers_a_broken_file_to_the_first_look(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    backend = select_backend({SIMULATION_VARIABLE: str(tmp_path / "broken.json")})
    assert isinstance(backend, SimulatedBackend)
    with pytest.raises(BackendError):
        backend.inventory()


@pytest.fixture
def nvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError


@pytest.fixture
def nvml_init_fails(monkeypatch):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def nvmlInit():
        raise NVMLError("Driver Not Loaded")

    fake.NVMLError, fake.nvmlInit = NVMLError, nvmlInit
    monkeypatch.setitem(sys.modules, "pynvml", fake)


@pytest.mark.parametrize(
    "nvml, why",
    [("nvml_not_installed", "not installed"), ("nvml_init_fails", "Driver Not Loaded")],
)
@pytest.mark.parametrize("environ", [{}, {SIMULATION_VARIABLE: ""}, {"OTHER": "4"}])
def test_without_simulation_or_nvml_there_are_no_gpus_and_a_reason(request, nvml, why,
                                                                    environ):
    request.getfixturevalue(nvml)
    backend = select_backend(environ)
    assert isinstance(backend, NoGpus)
    assert backend.name == "none"
    assert why in backend.reason
    assert SIMULATION_VARIABLE in backend.reason
    assert (backend.inventory(), backend.processes()) == ([], {})


def test_select_backend_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv(SIMULATION_VARIABLE, "2")
    assert len(select_backend().inventory()) == 2


def test_load_is_read_from_the_file_or_summed_from_its_processes(tmp_path):
    from resourced.backends import GpuLoad
    from resourced.backends.simulated import MIB, SimulatedBackend, simulated_uuid

    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [
        {"index": 0, "utilization_pct": 35, "memory_used_mib": 2048},
        {"index": 1, "processes": [{"pid": 7, "used_memory_mib": 100},
                                   {"pid": 8, "used_memory_mib": 28}]},
    ]}))
    assert SimulatedBackend(path=str(path)).load() == {
        simulated_uuid(0): GpuLoad(35, 2048 * MIB), simulated_uuid(1): GpuLoad(0, 128 * MIB)}
    assert SimulatedBackend(count=2).load() == {
        simulated_uuid(0): GpuLoad(0, 0), simulated_uuid(1): GpuLoad(0, 0)}
