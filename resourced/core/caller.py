"""Who is calling: the account and process the bus vouches for."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """Who is calling, as the bus (never the caller) says."""

    uid: int
    pid: int
    bus_name: str = ""
    nested: bool = False  # in a pid namespace below ours (a container): it names its own pids
