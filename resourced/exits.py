"""gpuctl's exit codes, and the one table that maps resourced errors to them."""

from resourced.errors import (
    AccessDenied,
    DaemonUnreachable,
    GPUsBusy,
    InteractiveAuthorizationRequired,
    Internal,
    InvalidArgs,
    LimitExceeded,
    NoSuchClaim,
    NoSuchPool,
    NotClaimOwner,
    NotEnoughCapacity,
    NotEnoughGPUs,
    NotProcessOwner,
    QueueTimeout,
    ResourcedError,
    StillInUse,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_ENOUGH_GPUS = 3
EXIT_GPUS_BUSY = 4
EXIT_UNREACHABLE = 5
EXIT_NO_SUCH_CLAIM = 6
EXIT_NOT_YOURS = 7
EXIT_ACCESS_DENIED = 8
EXIT_STILL_IN_USE = 9
EXIT_NO_SYSTEMD = 10  # gpuctl service: files written, but systemd is not running
EXIT_QUEUE_TIMEOUT = 11
EXIT_LIMIT = 12  # a per-user or per-session limit of the configuration (claims, GPUs, GPU-hours)
EXIT_CHECK_FAILED = 13  # gpuctl doctor: a check failed (with --strict: or warned)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

EXIT_CODES: dict[type[ResourcedError], int] = {
    InvalidArgs: EXIT_USAGE,
    NotEnoughGPUs: EXIT_NOT_ENOUGH_GPUS,
    NotEnoughCapacity: EXIT_NOT_ENOUGH_GPUS,
    NoSuchPool: EXIT_USAGE,
    QueueTimeout: EXIT_QUEUE_TIMEOUT,
    GPUsBusy: EXIT_GPUS_BUSY,
    DaemonUnreachable: EXIT_UNREACHABLE,
    NoSuchClaim: EXIT_NO_SUCH_CLAIM,
    NotProcessOwner: EXIT_NOT_YOURS,
    NotClaimOwner: EXIT_NOT_YOURS,
    AccessDenied: EXIT_ACCESS_DENIED,
    InteractiveAuthorizationRequired: EXIT_ACCESS_DENIED,
    StillInUse: EXIT_STILL_IN_USE,
    LimitExceeded: EXIT_LIMIT,
    Internal: EXIT_FAILURE,
}


class GpuctlError(Exception):
    """An error of gpuctl itself (not the daemon's), with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE, printed_json: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.printed_json = printed_json  # its --json answer is printed already


EXIT_NAMES = {EXIT_FAILURE: "Failed", EXIT_NO_SYSTEMD: "NoSystemd",
              EXIT_CHECK_FAILED: "CheckFailed", EXIT_INTERRUPTED: "Interrupted",
              **{code: cls.code for cls, code in reversed(EXIT_CODES.items())}}
"""The code a JSON error names for each exit code (the first error class that has it)."""


def exit_code_for(exc: Exception) -> int | None:
    """The exit code for a resourced error, or None for anything else."""
    if isinstance(exc, ResourcedError):
        return EXIT_CODES.get(type(exc), EXIT_FAILURE)
    return None
