"""evidence.host: RAM from MemAvailable, disk from f_bavail; failures raise, never guess."""

import os

import pytest

from resourced.config import CheckEntry
from resourced.core.health import Measurement
from resourced.evidence.host import measure, measure_disk, measure_ram

MEMINFO = """\
MemTotal:       16307908 kB
MemFree:          512000 kB
MemAvailable:    8153954 kB
Buffers:          123456 kB
HugePages_Total:       0
"""


def test_measure_ram_reads_memavailable_of_memtotal(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    assert measure_ram(str(path)) == Measurement(8153954 * 1024, 16307908 * 1024)


def test_measure_ram_without_memavailable_is_an_error(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n")
    with pytest.raises(ValueError, match="MemAvailable"):
        measure_ram(str(path))


def test_measure_ram_with_garbage_is_an_error(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal: lots kB\nMemAvailable: 10 kB\n")
    with pytest.raises(ValueError, match="MemTotal"):
        measure_ram(str(path))


def test_measure_ram_of_a_missing_file_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        measure_ram(str(tmp_path / "nope"))


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo")
def test_measure_ram_of_this_machine():
    m = measure_ram()
    assert 0 < m.free_bytes <= m.total_bytes


def test_measure_disk_of_a_real_path_matches_statvfs(tmp_path):
    m = measure_disk(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert m.total_bytes == st.f_blocks * st.f_frsize
    assert 0 <= m.free_bytes <= m.total_bytes
    # f_bavail may move between the two calls; within a few MiB it is the same figure
    assert abs(m.free_bytes - st.f_bavail * st.f_frsize) < 64 * 1024**2


def test_measure_disk_of_a_file_measures_its_filesystem(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert measure_disk(str(f)).total_bytes == measure_disk(str(tmp_path)).total_bytes


def test_measure_disk_of_a_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        measure_disk(str(tmp_path / "missing" / "data"))


def test_measure_dispatches_on_the_check_type(tmp_path):
    assert measure(CheckEntry("d", "disk", str(tmp_path))).total_bytes > 0
    with pytest.raises(ValueError):
        measure(CheckEntry("x", "tape"))
