"""Which device nodes a claim's scope allows: the granted GPUs' nodes, the nodes the
driver needs for any GPU (``/dev/nvidiactl``, ``/dev/nvidia-modeset``, ``/dev/nvidia-uvm``
and ``-tools``), and terminals (``/dev/tty``, ``/dev/ptmx``, pseudo-terminals), so that an
isolated command can prompt; systemd's ``DevicePolicy=closed`` adds its pseudo devices
(``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``).

Nodes are named by major and minor as read from the node (``/dev/char/MAJ:MIN``, which
systemd takes without a node of that name), so the driver's group names, which differ
between versions, do not matter.  ``nvidia-uvm`` is often created only at the first CUDA
call: it is also allowed by its major, as its group in ``/proc/devices`` names it.
"""

import os
import stat
from collections.abc import Callable, Iterable

SHARED_NODES = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "tty", "ptmx")
"""Nodes under /dev that every CUDA process opens, whichever GPU it uses; and terminals."""
GROUPS = ("char-pts",)
"""Device groups allowed whole: pseudo-terminals."""
ACCESS = "rw"


def char_node(path: str, stat_of: Callable = os.stat) -> str | None:
    """``/dev/char/MAJ:MIN`` for a character device node, None if there is none."""
    try:
        st = stat_of(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return f"/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def uvm_groups(proc_devices: str) -> list[str]:
    """``char-NAME`` for each character device group of nvidia-uvm in ``/proc/devices``."""
    groups, section = [], ""
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            section = line
            continue
        fields = line.split()
        if section.startswith("Character") and len(fields) == 2 and \
                fields[1].startswith("nvidia-uvm"):
            groups.append(f"char-{fields[1]}")
    return groups


def allowed(minors: Iterable[int], dev: str = "/dev", proc_devices: str = "",
            stat_of: Callable = os.stat) -> list[tuple[str, str]]:
    """``DeviceAllow=`` entries (specifier, access) for a scope that may use the GPUs of
    these minors: each one's node, the shared nodes that exist, the uvm groups."""
    nodes = [f"{dev}/nvidia{m}" for m in sorted(set(minors))]
    nodes += [f"{dev}/{name}" for name in SHARED_NODES]
    found = [spec for node in nodes if (spec := char_node(node, stat_of))]
    groups = [*uvm_groups(proc_devices), *GROUPS]
    return [(spec, ACCESS) for spec in dict.fromkeys(found + groups)]


def read_proc_devices() -> str:
    try:
        with open("/proc/devices") as f:
            return f.read()
    except OSError:
        return ""
