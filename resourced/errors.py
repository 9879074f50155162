"""The one error vocabulary shared by the core, the bus, the client and gpuctl.

    ResourcedError                  never raised itself; .code is stable
    ├── InvalidArgs                 bad arguments (org.freedesktop.DBus.Error.InvalidArgs)
    ├── NotEnoughGPUs               all-or-nothing refusal
    ├── NotEnoughCapacity           a pool (or VRAM) is short; also: more than it holds
    ├── NoSuchPool                  a request names a pool that does not exist
    ├── QueueTimeout                a waiting request was not granted in time
    ├── GPUsBusy                    the free GPUs run processes nobody claimed
    ├── NoSuchClaim                 unknown or stale claim reference
    ├── NotProcessOwner             an owner pid of another user
    ├── NotClaimOwner               touching another user's claim or booking
    ├── StillInUse                  a release while the claim's processes still use its GPUs
    ├── AccessDenied                the bus or polkit said no
    ├── InteractiveAuthorizationRequired  polkit would allow it after authentication
    ├── DaemonUnreachable           nobody owns org.resourced (client side only)
    ├── LimitExceeded               a per-user or per-session limit (claims, waiting
    │                               claims, GPUs, booked GPU-hours) is reached
    └── Internal                    anything unexpected; details are in the daemon's log

The core raises these; the bus adapter turns ``code`` into a D-Bus error name
(``org.resourced.Error.<code>`` or a standard name), the client turns the name back into
the same class, and gpuctl maps the class to an exit code.  Append only: codes are API.
Each class is named as its code; ``InvalidRequest`` and ``InteractionRequired`` are their
earlier names, kept for code written against them.
"""

ERROR_PREFIX = "org.resourced.Error."


def quoted(value, limit: int = 64) -> str:
    """A caller's value for an error message: its repr, cut to ``limit`` characters, so a
    1 MB argument is never echoed back (into the reply and the log) whole."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class ResourcedError(Exception):
    """Base of every error resourced reports; carries a stable ``code`` and a message."""

    code = "Failed"
    dbus_name: str | None = None  # set where a standard D-Bus name fits better than ours

    def __init__(self, message: str):
        if type(self) is ResourcedError:
            raise TypeError("raise a specific ResourcedError subclass")
        super().__init__(message)
        self.message = message

    @classmethod
    def bus_name(cls) -> str:
        return cls.dbus_name or ERROR_PREFIX + cls.code


class InvalidArgs(ResourcedError):
    """The arguments make no sense (zero GPUs, unknown option, a pid that does not exist)."""

    code = "InvalidArgs"
    dbus_name = "org.freedesktop.DBus.Error.InvalidArgs"


class NotEnoughGPUs(ResourcedError):
    """Fewer GPUs are free than requested; nothing was granted."""

    code = "NotEnoughGPUs"


class NotEnoughCapacity(ResourcedError):
    """A pool or VRAM is short now (or the request exceeds what it holds); nothing granted."""

    code = "NotEnoughCapacity"


class NoSuchPool(ResourcedError):
    """The request names a pool the daemon does not have."""

    code = "NoSuchPool"


class QueueTimeout(ResourcedError):
    """A waiting request was not granted within its timeout; it left the queue."""

    code = "QueueTimeout"


class GPUsBusy(ResourcedError):
    """Enough GPUs are unclaimed, but processes nobody claimed run on some of them."""

    code = "GPUsBusy"


class NoSuchClaim(ResourcedError):
    """No live claim has this reference (never existed, or already released)."""

    code = "NoSuchClaim"


class NotProcessOwner(ResourcedError):
    """The owner pid given belongs to another user."""

    code = "NotProcessOwner"


class NotClaimOwner(ResourcedError):
    """The claim (or booking) belongs to another user."""

    code = "NotClaimOwner"


class StillInUse(ResourcedError):
    """The claim's processes still run on its GPUs; release with FORCE to override."""

    code = "StillInUse"


class AccessDenied(ResourcedError):
    """The bus policy or polkit refused the call."""

    code = "AccessDenied"
    dbus_name = "org.freedesktop.DBus.Error.AccessDenied"


class InteractiveAuthorizationRequired(ResourcedError):
    """polkit would allow it after authentication (run from a terminal, or ask an admin)."""

    code = "InteractiveAuthorizationRequired"
    dbus_name = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"


class DaemonUnreachable(ResourcedError):
    """No daemon owns org.resourced on the bus that was tried."""

    code = "DaemonUnreachable"


class LimitExceeded(ResourcedError):
    """A request would pass a per-user or per-session limit of the configuration (claims,
    waiting claims, GPUs, booked GPU-hours); the message names the setting."""

    code = "LimitExceeded"


class Internal(ResourcedError):
    """An unexpected failure inside the daemon."""

    code = "Internal"


ALL_ERRORS: tuple[type[ResourcedError], ...] = (
    InvalidArgs,
    NotEnoughGPUs,
    NotEnoughCapacity,
    NoSuchPool,
    QueueTimeout,
    GPUsBusy,
    NoSuchClaim,
    NotProcessOwner,
    NotClaimOwner,
    StillInUse,
    AccessDenied,
    InteractiveAuthorizationRequired,
    DaemonUnreachable,
    LimitExceeded,
    Internal,
)

# D-Bus names that mean "nobody is there to answer".
UNREACHABLE_NAMES = frozenset(
    {
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoServer",
        "org.freedesktop.DBus.Error.NoReply",
        "org.freedesktop.DBus.Error.Disconnected",
    }
)


def left_the_queue(ref: str, reason: str) -> ResourcedError:
    """What a waiting claim that left the queue ungranted (for ``reason``) raises."""
    if reason == "timeout":
        return QueueTimeout(f"claim {ref} was not granted in time; it left the queue")
    return NoSuchClaim(f"claim {ref} left the queue: {reason}")


def error_from_bus(name: str, message: str) -> ResourcedError:
    """The exception a client raises for a D-Bus error reply."""
    for cls in ALL_ERRORS:
        if cls.bus_name() == name:
            return cls(message)
    if name in UNREACHABLE_NAMES:
        return DaemonUnreachable(message or "the resourced daemon is not running")
    if name == "org.freedesktop.DBus.Error.UnknownMethod":
        return InvalidArgs(message)
    if name == "org.freedesktop.DBus.Error.UnknownObject":  # a claim's object, gone
        return NoSuchClaim(message or "no such claim (unknown or already released)")
    return Internal(f"{name}: {message}" if message else name)


InvalidRequest = InvalidArgs
InteractionRequired = InteractiveAuthorizationRequired
