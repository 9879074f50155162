"""Bus names, object paths and interface names: the fixed contract with clients."""

import os.path

BUS_NAME = "org.resourced"
MANAGER_PATH = "/org/resourced"
MANAGER_IFACE = "org.resourced.Manager"
GPU_IFACE = "org.resourced.GPU"
CLAIM_IFACE = "org.resourced.Claim"
ACCOUNT = "resourced"
"""The system service's account (made by ``gpuctl service enable --system``)."""
BUS_DRIVER = {"destination": "org.freedesktop.DBus", "path": "/org/freedesktop/DBus",
              "interface": "org.freedesktop.DBus"}
"""The bus itself, as the daemon calls it: ``Message(**BUS_DRIVER, member=...)``."""

JSON_SCHEMA = 2
"""The version of the JSON the daemon and gpuctl emit (Describe, status/verify --json):
keys are added, never renamed or removed, within one version; all keys are snake_case.
2: ``gpus`` is a list everywhere, the GPUs themselves (objects) for the machine and their
aliases for a claim or a booking; a count is ``gpus_requested`` (a booking's ``gpus`` was
its count in 1) or ``gpu_count``."""
RELEASE_FORCE = 1 << 0
"""Release flag: skip the in-use check."""
RELEASE_DRY_RUN = 1 << 1
"""Release flag: make every check, release nothing."""


def gpu_path(index: int) -> str:
    return f"{MANAGER_PATH}/gpu/{index}"


CLAIM_PREFIX = f"{MANAGER_PATH}/claim/"


def claim_path(claim_id: str) -> str:
    return CLAIM_PREFIX + claim_id

CHECK_IFACE = "org.resourced.Check"


def escape_element(name: str) -> str:
    """An object path element for any name: bytes outside [A-Za-z0-9] become _xx (hex)."""
    return "".join(
        chr(b) if chr(b).isascii() and chr(b).isalnum() else f"_{b:02x}" for b in name.encode()
    ) or "_"


def check_path(name: str) -> str:
    return f"{MANAGER_PATH}/check/{escape_element(name)}"

POOL_IFACE = "org.resourced.Pool"


def pool_path(name: str) -> str:
    return f"{MANAGER_PATH}/pool/{escape_element(name)}"

USER_IFACE = "org.resourced.User"
USER_PREFIX = f"{MANAGER_PATH}/user/"


def user_path(uid: int) -> str:
    """Where signals about one user's bookings go: only that user's clients listen."""
    return f"{USER_PREFIX}{uid}"


SHARED_SOCKET = "bus"
"""The socket of a shared bus (``resourced --shared DIR``), inside DIR."""


def shared_bus_address(directory) -> str:
    """The D-Bus address of the shared bus in ``directory``."""
    return f"unix:path={os.path.join(directory, SHARED_SOCKET)}"


NO_SESSION_BUS = ("there is no session bus here ($DBUS_SESSION_BUS_ADDRESS is not set, and no "
                  "$XDG_RUNTIME_DIR/bus): log in with a user session (systemd --user gives "
                  "one), or start one for a shell: dbus-run-session -- bash")
"""What to say where the session bus is wanted and there is none, instead of the bus
library's text (``no_session_bus`` adds what else a shell without a session needs)."""
NO_RUNTIME_DIR = "export XDG_RUNTIME_DIR=$(mktemp -d)"
"""A runtime directory of one's own (0700) where no session manager made one."""


def no_session_bus(environ=os.environ) -> str:
    """NO_SESSION_BUS, and where $XDG_RUNTIME_DIR is not set either (a bare ssh login, a
    container), the step the daemon also needs in that shell."""
    if environ.get("XDG_RUNTIME_DIR"):
        return NO_SESSION_BUS
    return f"{NO_SESSION_BUS}, and in it {NO_RUNTIME_DIR}"


def session_bus_missing(environ=os.environ) -> bool:
    """True when no session bus can be found the way the bus libraries look for one."""
    if environ.get("DBUS_SESSION_BUS_ADDRESS"):
        return False
    runtime = environ.get("XDG_RUNTIME_DIR")
    return not (runtime and os.path.exists(os.path.join(runtime, "bus")))
