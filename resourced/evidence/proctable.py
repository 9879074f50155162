"""The process table, read from /proc in one pass (blocking: run it off the event loop)."""

import os

from resourced.core.attribution import ProcInfo

from .processes import PROC


def _status_fields(pid: int) -> dict[bytes, list[bytes]]:
    fields = {}
    with open(f"{PROC}/{pid}/status", "rb") as f:
        for line in f:
            key, _, value = line.partition(b":")
            if key in (b"Uid", b"NSpid", b"Tgid"):
                fields[key] = value.split()
    return fields


def read_process(pid: int) -> ProcInfo | None:
    """One process (not a thread, not a zombie), or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
        stat = data[data.rindex(b")") + 2 :].split()
        if stat[0] in (b"Z", b"X"):
            return None
        status = _status_fields(pid)
    except (OSError, ValueError, IndexError):
        return None
    if int(status[b"Tgid"][0]) != pid:
        return None
    return ProcInfo(
        pid=pid,
        ppid=int(stat[1]),
        start_time=int(stat[19]),
        uid=int(status[b"Uid"][0]),
        nested_namespace=len(status.get(b"NSpid", [b"0"])) > 1,
        name=data[data.index(b"(") + 1 : data.rindex(b")")].decode(errors="replace"),
    )


def read_table() -> dict[int, ProcInfo]:
    """Every process visible here, by pid."""
    table = {}
    for name in os.listdir(PROC):
        if name.isdigit():
            info = read_process(int(name))
            if info is not None:
                table[info.pid] = info
    return table


MAX_DEPTH = 4096


def ancestry(pid: int) -> list[ProcInfo]:
    """The process and its ancestors up to init; empty if the process is not visible."""
    chain: list[ProcInfo] = []
    while pid > 0 and len(chain) < MAX_DEPTH:
        info = read_process(pid)
        if info is None:
            break
        chain.append(info)
        pid = info.ppid
    return chain


def command_line(pid: int, limit: int = 200) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read(limit * 4)
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


