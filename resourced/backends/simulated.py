"""Simulated GPUs, for tests, demos and machines without NVIDIA hardware.

``RESOURCED_SIMULATED_GPUS`` is either a whole number N (N idle GPUs) or the path of a
JSON file, looked at on every look (parsed again when it changed: a new inode, size or
mtime), so a test can change what "the driver" reports::

    {"gpus": [{"index": 0, "uuid": "GPU-...", "name": "...", "memory_total_mib": 81920,
               "pci_bus_id": "00000000:01:00.0", "minor": 0,
               "processes": [{"pid": 4242, "used_memory_mib": 1024}],
               "utilization_pct": 35, "memory_used_mib": 1024}]}

Only ``index`` is required per GPU (a GPU's memory in use defaults to its processes'); the rest has simulation defaults.  A top-level
``"hang_seconds": S`` makes every look take S seconds, like a hung driver.
"""

import json
import os
import time

from resourced.core.inventory import Gpu

from .base import BackendError, GpuLoad, GpuProcess

MIB = 1024 * 1024
DEFAULT_MEMORY_MIB = 81920


def simulated_uuid(index: int) -> str:
    return f"GPU-5e1a7ed0-0000-4000-8000-{index:012d}"


MAX_GPUS = 4096
"""The most GPUs a simulation may have (a machine has at most a few dozen)."""


class SimulatedBackend:
    name = "simulated"

    def __init__(self, count: int | None = None, path: str | None = None):
        self.count = count
        self.path = path
        self.blocking = path is not None  # a count is answered from memory
        self._read: tuple | None = None  # (the file's identity, its entries, hang) last read
        self._uuids = [simulated_uuid(i) for i in range(count or 0)]  # (a count's, made once)
        self._listed: tuple | None = None  # (entries, processes) of the file's last version

    @classmethod
    def from_setting(cls, value: str) -> "SimulatedBackend":
        """``RESOURCED_SIMULATED_GPUS``: a number of idle GPUs (0 to ``MAX_GPUS``) or the
        path of a simulation file; ValueError, naming the variable, for anything else."""
        value = value.strip()
        if value.isascii() and value.isdigit():
            if int(value) > MAX_GPUS:
                raise ValueError(f"RESOURCED_SIMULATED_GPUS={value}: a number of GPUs is from "
                                 f"0 to {MAX_GPUS}")
            return cls(count=int(value))
        if not os.path.isfile(value):
            raise ValueError(f"RESOURCED_SIMULATED_GPUS={value}: neither a number of GPUs "
                             "nor a simulation file that exists")
        return cls(path=value)

    def _entries(self) -> list[dict]:
        if self.path is None:
            return [{"index": i} for i in range(self.count or 0)]
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._read is None or self._read[0] != identity:  # parsed once per version
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f)
                entries = data["gpus"]
                if not isinstance(entries, list):
                    raise TypeError("'gpus' must be a list")
                self._read = (identity, entries, float(data.get("hang_seconds", 0)))
            _, entries, hang = self._read
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendError(f"simulation file {self.path}: {exc}") from exc
        if hang > 0:
            time.sleep(hang)
        return entries

    def inventory(self) -> list[Gpu]:
        return [_gpu(e) for e in self._entries()]

    def processes(self) -> dict[str, list[GpuProcess]]:
        """One reading of the file, so GPUs and processes always come from the same state."""
        if self.path is None:  # N idle GPUs
            return {uuid: [] for uuid in self._uuids}
        entries = self._entries()
        if self._listed is None or self._listed[0] is not entries:  # made once per version
            self._listed = (entries, {_gpu(e).uuid: _processes(e) for e in entries})
        return {uuid: list(procs) for uuid, procs in self._listed[1].items()}


    def processes_now(self) -> dict[str, list[GpuProcess]] | None:
        """The processes of the file's version read last, if the file is still at that
        version and hangs nothing: one ``stat``, so the probe asks on the event loop and
        spares the hop to its thread.  None: ask ``processes`` (off the loop)."""
        read, listed = self._read, self._listed  # (set by the probe's thread: read once)
        if read is None or listed is None or listed[0] is not read[1] or read[2] > 0:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if (st.st_ino, st.st_mtime_ns, st.st_size) != read[0]:
            return None
        return {uuid: list(procs) for uuid, procs in listed[1].items()}

    def load(self) -> dict[str, GpuLoad]:
        return {_gpu(e).uuid: _load(e) for e in self._entries()}


def _load(e: dict) -> GpuLoad:
    try:
        used = e.get("memory_used_mib")
        in_use = int(used) * MIB if used is not None else sum(
            p.used_memory_bytes for p in _processes(e))
        return GpuLoad(int(e.get("utilization_pct", 0)), in_use)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"simulation entry {e!r}: {exc}") from exc


def _gpu(e: dict) -> Gpu:
    try:
        index = int(e["index"])
        return Gpu(
            index=index,
            uuid=str(e.get("uuid") or simulated_uuid(index)),
            name=str(e.get("name", "Simulated GPU")),
            memory_bytes=int(e.get("memory_total_mib", DEFAULT_MEMORY_MIB)) * MIB,
            pci_bus_id=str(e.get("pci_bus_id") or f"00000000:{index + 1:02x}:00.0"),
            minor=int(e.get("minor", index)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BackendError(f"simulation entry {e!r}: {exc}") from exc


def _processes(e: dict) -> list[GpuProcess]:
    try:
        listed = e.get("processes", [])
        if not isinstance(listed, list):
            raise TypeError("'processes' must be a list")
        return [GpuProcess(int(p["pid"]), int(p.get("used_memory_mib", 0)) * MIB) for p in listed]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BackendError(f"simulation entry {e!r}: {exc}") from exc
