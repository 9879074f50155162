"""The configuration file: where it is, what it may say, and what a reload changes.

Lookup (``find_config``): ``--config FILE``, else ``$RESOURCED_CONFIG``, else
``$XDG_CONFIG_HOME/resourced/config.toml`` (default ``~/.config/resourced/config.toml``),
else ``/etc/resourced/config.toml``.  The system service skips the per-user file.  A file
named explicitly (the option or the variable) must exist; the implicit ones are skipped
when absent; with no file at all the defaults apply.  ``examples/config.toml`` documents
every key.

Checking is strict, because a typo that is silently ignored is a limit that silently does
not apply: unknown sections and keys are errors, booleans are not numbers, and every
problem is one ``ConfigError`` whose text is one line naming the file, the key and what is
wrong::

    /etc/resourced/config.toml: daemon.probe_timeout: must be a number greater than 0, not 'abc'
    /etc/resourced/config.toml: check[1].path: required for type "disk"

Entries of ``[[gpu]]``, ``[[check]]`` and ``[[pool]]`` are named by their position in the
file counting from 0 (``check[1]`` is the second ``[[check]]``), as in jq or Python.

The predecessor's ``[daemon]`` keys are still read, each with a note (``Config.notes``)
that ``config check`` prints and the daemon logs at start: ``socket_group`` as
``access_group``, its name now, and ``nvidia_smi``, which nothing uses (``_OLD_DAEMON``).

Nothing here does I/O beyond reading the one file; the daemon decides what the values
mean (``runtime_dir = ""`` is "the mode's default", for instance).
"""

import dataclasses
import errno
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from resourced.core.health import CheckEntry
from resourced.linux.xdg import base_dir
from resourced.protocol.amounts import MAX_AMOUNT, parse_amount

__all__ = [
    "SYSTEM_CONFIG",
    "CheckEntry",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "GpuEntry",
    "McpConfig",
    "PoolEntry",
    "RunnerConfig",
    "SlurmConfig",
    "find_config",
    "for_the_bus",
    "load_config",
    "parse_config",
    "reload_changes",
]

SYSTEM_CONFIG = Path("/etc/resourced/config.toml")


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is one line for the user.

    ``source`` is the file, ``key`` the dotted key (``daemon.probe_timeout``,
    ``check[1].path``) or None for the file as a whole, ``problem`` what is wrong.
    """

    def __init__(self, source: str, key: str | None, problem: str):
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + problem)


# --- the parsed configuration ------------------------------------------------------------


@dataclass(frozen=True)
class DaemonConfig:
    """``[daemon]``: times are in seconds."""

    runtime_dir: str = ""            # "" = the mode's default, decided by the daemon
    probe_timeout: float = 10.0      # a GPU or disk probe slower than this has failed
    sample_interval: float = 30.0    # between resource samples
    dead_owner_grace: float = 600.0  # release a dead owner's claims after this; 0 = never
    access_group: str = "resourced"  # group allowed to use a shared (system or --shared) daemon
    persist: bool = True             # keep live claims across daemon restarts
    shared_dir: str = ""             # host a shared bus in this directory (resourced --shared)
    max_claims_per_user: int = 1024  # live claims (granted or waiting) of one user; 0 = no limit
    max_waiting_per_user: int = 64   # waiting claims of one user; 0 = no limit
    max_priority: int = 100          # a higher one needs the manage action (shared buses)
    state_dir: str = ""              # the calendar's lasting state; "" = the mode's default
    longest_booking: float = 7 * 86400      # 0 = no limit
    booking_horizon: float = 30 * 86400     # how far ahead a booking may start; 0 = no limit
    max_bookings_per_user: int = 64         # scheduled or active; 0 = no limit
    booking_retention: float = 30 * 86400   # how long ended bookings stay listed
    warn_before: float = 300.0              # warn a claim or booking this long before its end
    no_show_after: float = 3600.0   # release an active booking none of whose GPUs its owner used; 0 = never
    idle_after: float = 0.0         # release a claim with no process on its GPUs this long; 0 = never
    usage_retention: float = 400 * 86400        # usage history: holds and daily GPU load
    usage_hour_retention: float = 90 * 86400    # hourly GPU load
    usage_minute_retention: float = 2 * 86400   # per-minute GPU load
    # Limits on agent sessions (and more on users), all 0 = no limit.
    max_gpus_per_user: int = 0               # GPUs held or waited for (a share counts one)
    max_claims_per_session: int = 0          # live claims of one session
    max_gpus_per_session: int = 0
    # GPU-hours of live bookings (a share: one GPU); None: the bus's default (for_the_bus)
    max_booked_gpu_hours_per_user: float | None = None
    max_booked_gpu_hours_per_session: float = 0.0
    # Every user is under the limits, root too, except that these (user names) are spared
    # the per-user ones: never a session's, so an agent swarm run as root is capped.
    exempt_users: tuple[str, ...] = ()
    # Whether a claim's processes are confined to its GPUs (systemd scopes): "off",
    # "opt-in" (gpuctl run --isolate, claim --isolate) or "always" (every command run
    # through resourced but root's; only an administrator may opt out). The system
    # service only.
    isolation: str = "off"


def for_the_bus(daemon: DaemonConfig, shared: bool, gpus: int) -> DaemonConfig:
    """``daemon`` with its bus's defaults filled in, for a daemon serving ``gpus`` GPUs.

    On a shared bus (the system bus, ``--shared``) a member's live bookings may hold at
    most a quarter of the GPU-hours the booking horizon holds (4 GPUs, 30 days: 720, the
    whole machine for 7.5 days or one GPU for the whole horizon), so no one can book the
    machine for the whole horizon; claims need no cap of their own, since a claim holds
    its GPUs only until another's booking needs them.  On the session bus, one person's,
    there is no limit.  A value in the file (0: no limit) is kept as it is."""
    if daemon.max_booked_gpu_hours_per_user is not None:
        return daemon
    hours = gpus * daemon.booking_horizon / 3600 / 4 if shared else 0.0
    return replace(daemon, max_booked_gpu_hours_per_user=round(hours, 3))


@dataclass(frozen=True)
class GpuEntry:
    """One ``[[gpu]]``: when any are listed, only the listed GPUs are managed."""

    uuid: str
    alias: str | None = None
    index: int | None = None


@dataclass(frozen=True)
class PoolEntry:
    """One ``[[pool]]``: a named quantity (bytes for amounts with a unit, else a count).

    Naming a host pool (``cpu``, ``ram``) sets its capacity instead of the machine's."""

    name: str
    capacity: int
    unit: str = "count"  # bytes | count


@dataclass(frozen=True)
class RunnerConfig:
    """``[runner]``, read by ``gpuctl runner`` when it starts (not by the daemon): ``grace``
    is the seconds between SIGTERM to a booking's command and SIGKILL (at the end)."""

    grace: float = 30.0


@dataclass(frozen=True)
class McpConfig:
    """``[mcp]``, read by ``resourced-mcp`` (not by the daemon) at each call of its ``run``
    tool: whether that tool may start commands through your runner, and which, where.
    A command is allowed when the words of an ``allow_commands`` entry are its first
    words (the first compared as the program each names, symbolic links resolved), and
    its folder when it lies in an ``allow_dirs`` folder (symbolic links resolved)."""

    # Let the run tool start commands (as booked commands, through your runner); false:
    # it refuses them all and starts nothing.
    run: bool = False
    # The commands it may start, each the first words of the command line: a program
    # ("python3", "/usr/bin/python3") or a prefix ("python3 -m pytest", "uv run").
    # A name is looked up on PATH; [] allows none. An interpreter allows any code.
    allow_commands: tuple[str, ...] = ()
    # The folders (absolute, or starting with ~/) a command may run in, with all below
    # them; [] allows none.
    allow_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmConfig:
    """``[slurm]``: the GPUs Slurm schedules here, ``"all"`` or names (UUID, alias,
    ``gpuN`` or index).  resourced never grants them to its own claims or bookings; a
    job's prolog makes them its claim (``gpuctl slurm prolog``)."""

    gpus: str | tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: ``textfile``, a file the daemon keeps holding its metrics for
    node_exporter's textfile collector ("" for none)."""

    textfile: str = ""


@dataclass(frozen=True)
class Config:
    """A whole configuration; ``source`` is the file it came from, "" for the defaults."""

    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    gpus: tuple[GpuEntry, ...] = ()
    checks: tuple[CheckEntry, ...] = ()
    pools: tuple[PoolEntry, ...] = ()
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str = ""
    notes: tuple[str, ...] = ()  # how the file's words of the predecessor's were read

    def as_dict(self) -> dict:
        """Plain data (dicts, lists, str, numbers, bools, None) for JSON."""
        return _plain(dataclasses.asdict(self))


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --- finding and reading the file --------------------------------------------------------


def find_config(cli_path: str | None, environ=os.environ, system: bool = False) -> Path | None:
    """The file to use, or None when there is none (then the defaults apply).

    ``system=True`` is the system service: it never reads a per-user file.
    """
    if cli_path is not None:
        return _named(cli_path, None)
    if environ.get("RESOURCED_CONFIG"):
        return _named(environ["RESOURCED_CONFIG"], "RESOURCED_CONFIG")
    candidates = [] if system else [_user_config(environ)]
    candidates.append(SYSTEM_CONFIG)
    for path in candidates:
        if path is not None and path.exists():
            return path
    return None


def _named(name: str, variable: str | None) -> Path:
    """An explicitly named file, which must exist; ``variable`` is where the name came from."""
    by = f" (named by ${variable})" if variable else ""
    if not name:
        raise ConfigError("--config", None, "the file name is empty")
    try:
        st = os.stat(name)
    except OSError as exc:
        raise ConfigError(name, None, _unreadable(exc) + by) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(name, None, f"{_kind(st.st_mode)}, not a regular file{by}")
    return Path(name)


def _unreadable(exc: OSError) -> str:
    """Why a file cannot be opened, in words (a symlink loop is not "no such file")."""
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    return f"cannot read: {exc.strerror or exc}"


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "is a directory", stat.S_ISFIFO: "is a FIFO (named pipe)",
             stat.S_ISSOCK: "is a socket", stat.S_ISCHR: "is a character device",
             stat.S_ISBLK: "is a block device"}
    return next((text for test, text in kinds.items() if test(mode)), "is a special file")


def _user_config(environ) -> Path | None:
    try:
        return Path(base_dir("XDG_CONFIG_HOME", environ), "resourced", "config.toml")
    except RuntimeError:  # no $HOME and no passwd entry: there is no user file
        return None


def load_config(path: Path | None) -> Config:
    """Read and check ``path``; None gives the defaults."""
    if path is None:
        return Config()
    source = str(path)
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise ConfigError(source, None, _unreadable(exc)) from exc
    except _Bad as exc:
        raise ConfigError(source, None, str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, None, f"not UTF-8 text (byte {exc.start})") from exc
    return parse_config(text.removeprefix("\ufeff"), source)


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file; anything else (a FIFO would block forever) is refused
    before a single byte is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _Bad(f"{_kind(mode)}, not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


_TOML_WHERE = re.compile(
    r"(?P<message>.*?) \((?P<where>at line \d+, column \d+|at end of document)\)"
)


def parse_config(text: str, source: str) -> Config:
    """Check the TOML ``text``; ``source`` names it in errors and in ``Config.source``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "cannot parse"
        m = _TOML_WHERE.fullmatch(message)
        problem = (
            f"invalid TOML {m['where']}: {m['message']}" if m else f"invalid TOML: {message}"
        )
        raise ConfigError(source, None, problem) from None
    except RecursionError:
        raise ConfigError(source, None, "invalid TOML: arrays or tables nested too deeply") from None
    return _Checker(source).config(doc)


# --- checking ----------------------------------------------------------------------------


class _Bad(Exception):
    """A value's problem, before the checker adds the file and the key."""


def _show(value) -> str:
    """A value as the user wrote it, on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + "...'"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figure(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _number(low: float, *, strict: bool = False, high: float | None = None):
    if high is not None and strict:
        wanted = f"a number greater than {_figure(low)} and at most {_figure(high)}"
    elif high is not None:
        wanted = f"a number from {_figure(low)} to {_figure(high)}"
    else:
        wanted = f"a number greater than {low:g}" if strict else f"a number of at least {low:g}"

    def check(value):
        ok = _is_number(value) and math.isfinite(value)
        ok = ok and (value > low if strict else value >= low)
        ok = ok and (high is None or value <= high)
        if not ok:
            raise _Bad(f"must be {wanted}, not {_show(value)}")
        return float(value)

    return check


def _seconds(low: float, *, strict: bool = False, high: float):
    """A span in seconds: a number is seconds, a string takes the duration grammar
    (``"2d"``, ``"30m"``, ``"1:30:00"``), and the result is held to the bounds."""
    number = _number(low, strict=strict, high=high)

    def check(value):
        if not isinstance(value, str):
            return number(value)
        from resourced.protocol.when import DURATION_FORMS, parse_duration

        try:
            return number(parse_duration(value))
        except (ValueError, _Bad) as exc:
            if isinstance(exc, _Bad):
                bounds = str(exc).removeprefix("must be ").rsplit(", not ", 1)[0]
            elif _is_number_text(value):
                bounds = f"a number of seconds ({value.strip()}) or have a unit"
            else:
                bounds = f"seconds or a duration like {DURATION_FORMS}"
            raise _Bad(f"must be {bounds}, not {_show(value)}") from None

    return check


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _index(value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**31 - 1:
        raise _Bad(f"must be a whole number from 0 to {2**31 - 1}, not {_show(value)}")
    return value


def _boolean(value):
    if not isinstance(value, bool):
        raise _Bad(f"must be true or false, not {_show(value)}")
    return value


def _string(pattern: str | None = None, wanted: str = "a non-empty string"):
    regex = re.compile(pattern or r"[^\x00-\x1f\x7f]+")

    def check(value):
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise _Bad(f"must be {wanted}, not {_show(value)}")
        return value

    return check


def _directory(value):
    if not isinstance(value, str) or (value and not os.path.isabs(value)) or "\0" in value:
        raise _Bad(f'must be an absolute path, or "" for the default, not {_show(value)}')
    return value


def _user_names(value):
    if not isinstance(value, list) or not all(
            isinstance(v, str) and re.fullmatch(_GROUP, v) for v in value):
        raise _Bad(f'must be a list of user names, like ["root"], not {_show(value)}')
    return tuple(value)


def _commands(value):
    """``[mcp] allow_commands``: command lines, each split into words as a shell would."""
    import shlex

    wanted = 'a list of commands, like ["python3", "uv run"]'
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad(f"must be {wanted}, not {_show(value)}")
    for entry in value:
        try:
            words = shlex.split(entry)
        except ValueError as exc:
            raise _Bad(f"{_show(entry)} cannot be split into words ({exc})") from None
        if not words or "\0" in entry:
            raise _Bad(f"must be {wanted}, not {_show(entry)}")
        if "/" in words[0] and not (os.path.isabs(words[0]) or words[0].startswith("~/")):
            raise _Bad(f"{_show(entry)}: a program is a name on PATH or an absolute path "
                       "(or ~/...), not a relative one")
    return tuple(value)


def _folders(value):
    """``[mcp] allow_dirs``: absolute folders, or ``~/...`` (the user's home)."""
    wanted = 'a list of absolute folders, like ["~/src", "/data/runs"]'
    if not isinstance(value, list) or not all(
            isinstance(v, str) and "\0" not in v and (os.path.isabs(v) or v == "~"
                                                       or v.startswith("~/")) for v in value):
        raise _Bad(f"must be {wanted}, not {_show(value)}")
    return tuple(value)


def _textfile(value):
    if value == "":
        return value
    if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
        raise _Bad(f'must be an absolute path, or "" for none, not {_show(value)}')
    if not value.endswith(".prom"):
        raise _Bad(f"must end in .prom (node_exporter's textfile collector reads only "
                   f"those), not {_show(value)}")
    return value


def _capacity(value):
    try:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return parse_amount(value)
    except ValueError as exc:
        if str(exc).startswith("too large"):
            raise _Bad(f"must be at most {MAX_AMOUNT}, not {_show(value)}") from None
    raise _Bad(f'must be a positive whole number or an amount like "64G", not {_show(value)}')


def _slurm_gpus(value):
    if value == "all":
        return value
    names = value if isinstance(value, list) else None
    if names is None or not all(isinstance(n, str) and n.strip() or _is_number(n) and
                                isinstance(n, int) and n >= 0 for n in names):
        raise _Bad(f'must be "all" or a list of GPUs (UUID, alias or index), not {_show(value)}')
    return tuple(str(n) for n in names)


def _unit_of(written, name: str) -> str:
    """The default unit: bytes when the capacity was written with a unit ("64G"), or for
    the ram pool; else a count."""
    if name == "ram" or (isinstance(written, str) and any(c.isalpha() for c in written)):
        return "bytes"
    return "count"


_ALIAS = r"[A-Za-z0-9_-]+"
_POOL_NAME = r"[a-z0-9][a-z0-9_.-]*"
# shadow-utils' rule, loosened as Debian does (capitals, dots); at most 32 characters.
_GROUP = r"[A-Za-z_](?:[A-Za-z0-9_.-]{0,31}|[A-Za-z0-9_.-]{0,30}\$)"

_PCT = _number(0, high=100)
_GIB = _number(0, high=2**30)  # (an exbibyte)
DAY = 86400.0
YEARS_10 = 3650 * DAY
"""The longest span any setting may name: a larger one is a slip (1e308 seconds hung the
daemon at start), refused with the key named."""
_SECONDS = _seconds(0, high=YEARS_10)
_SECONDS_ABOVE_0 = _seconds(0, strict=True, high=YEARS_10)
_GPU_HOURS = _number(0, high=1e9)

# For each table: key -> (check, required).  Optional keys missing from the file keep
# their dataclass default.
_DAEMON = {
    "runtime_dir": (_directory, False),
    "probe_timeout": (_seconds(0, strict=True, high=3600), False),
    "sample_interval": (_seconds(0, strict=True, high=DAY), False),
    "dead_owner_grace": (_SECONDS, False),
    "access_group": (_string(_GROUP, "a valid group name"), False),
    "persist": (_boolean, False),
    "shared_dir": (_directory, False),
    "max_claims_per_user": (_index, False),
    "max_waiting_per_user": (_index, False),
    "max_priority": (_index, False),
    "state_dir": (_directory, False),
    "longest_booking": (_SECONDS, False),
    "booking_horizon": (_SECONDS, False),
    "max_bookings_per_user": (_index, False),
    "booking_retention": (_SECONDS, False),
    "warn_before": (_SECONDS, False),
    "no_show_after": (_SECONDS, False),
    "idle_after": (_SECONDS, False),
    "usage_retention": (_SECONDS_ABOVE_0, False),
    "usage_hour_retention": (_SECONDS_ABOVE_0, False),
    "usage_minute_retention": (_SECONDS_ABOVE_0, False),
    "max_gpus_per_user": (_index, False),
    "max_claims_per_session": (_index, False),
    "max_gpus_per_session": (_index, False),
    "max_booked_gpu_hours_per_user": (_GPU_HOURS, False),
    "max_booked_gpu_hours_per_session": (_GPU_HOURS, False),
    "exempt_users": (_user_names, False),
    "isolation": (_string("off|opt-in|always", '"off", "opt-in" or "always"'), False),
}
_GPU = {
    "uuid": (_string(r"\S+", "a non-empty string without spaces"), True),
    "alias": (_string(_ALIAS, "letters, digits, '_' and '-' only"), False),
    "index": (_index, False),
}
_CHECK = {
    "name": (_string(), True),
    "type": (None, True),  # checked by hand: what else is allowed depends on it
    "path": (None, False),
    "warn_free_gib": (_GIB, False),
    "stop_free_gib": (_GIB, False),
    "warn_free_pct": (_PCT, False),
    "stop_free_pct": (_PCT, False),
    "warn_used_pct": (_PCT, False),
    "stop_used_pct": (_PCT, False),
}
_POOL = {
    "name": (_string(_POOL_NAME, "lower-case letters, digits, '_', '.' and '-', "
                     "starting with a letter or digit"), True),
    "capacity": (_capacity, True),
    "unit": (_string("bytes|count", '"bytes" or "count"'), False),
}
_SLURM = {"gpus": (_slurm_gpus, False)}
_RUNNER = {"grace": (_seconds(0, high=DAY), False)}
_METRICS = {"textfile": (_textfile, False)}
_MCP = {"run": (_boolean, False), "allow_commands": (_commands, False),
        "allow_dirs": (_folders, False)}
# The predecessor's [daemon] keys: each is read, and noted. A key renamed maps to its name
# now; nvidia_smi maps to None: checked and not used (the why is in the note).
_OLD_DAEMON = {
    "socket_group": "access_group",
    "nvidia_smi": None,
}
_NVIDIA_SMI_UNUSED = (
    "daemon.nvidia_smi is not used: resourced reads the GPUs through NVML, the library "
    "nvidia-smi is itself built on, so where NVML cannot be loaded nvidia-smi cannot answer "
    "either; the line can go")
_TABLES = ("daemon", "runner", "mcp", "slurm", "metrics")
_ARRAYS = {"gpu": _GPU, "check": _CHECK, "pool": _POOL}

CHECK_TYPES = ("ram", "disk")


class _Checker:
    """Turns the TOML document into a ``Config``, raising at the first problem."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str | None, problem: str):
        raise ConfigError(self.source, key, problem)

    def config(self, doc: dict) -> Config:
        known = [*_TABLES, *_ARRAYS]
        for name, value in doc.items():
            if name not in known:
                self.unknown(name, value, known)
        tables = {name: self.section(name, doc.get(name, {})) for name in _TABLES}
        entries = {name: self.array(name, doc.get(name, [])) for name in _ARRAYS}
        daemon, notes = self.old_daemon_keys(tables["daemon"])
        return Config(
            daemon=DaemonConfig(**self.table(daemon, "daemon", _DAEMON)),
            gpus=self.gpus(entries["gpu"]),
            checks=self.checks(entries["check"]),
            pools=self.pools(entries["pool"]),
            slurm=SlurmConfig(**self.table(tables["slurm"], "slurm", _SLURM)),
            runner=RunnerConfig(**self.table(tables["runner"], "runner", _RUNNER)),
            mcp=McpConfig(**self.table(tables["mcp"], "mcp", _MCP)),
            metrics=MetricsConfig(**self.table(tables["metrics"], "metrics", _METRICS)),
            source=self.source,
            notes=notes,
        )

    def old_daemon_keys(self, table: dict) -> tuple[dict, tuple[str, ...]]:
        """``[daemon]`` with the predecessor's keys read as today's, and a note for each."""
        table, notes = dict(table), []
        for old, new in _OLD_DAEMON.items():
            if old not in table:
                continue
            value = table.pop(old)
            if new is None:
                self.value(f"daemon.{old}", value, _string())
                notes.append(_NVIDIA_SMI_UNUSED)
            elif new in table and table[new] != value:
                self.fail(f"daemon.{old}", f"is the old name of {new}, which says "
                          f"{_show(table[new])}: keep {new} alone")
            else:
                table[new] = self.value(f"daemon.{old}", value, _DAEMON[new][0])
                notes.append(f"daemon.{old} is read as daemon.{new}, the name it has now")
        return table, tuple(notes)

    def unknown(self, key: str, value, known: list[str]):
        name = key.rsplit(".", 1)[-1]
        import difflib  # (here: only a mistyped key pays for it)

        guess = difflib.get_close_matches(name, [k.rsplit(".", 1)[-1] for k in known], n=1)
        if guess and "." not in key:  # a section: spell it as it is written
            guess = [f"[{guess[0]}]" if guess[0] in _TABLES else f"[[{guess[0]}]]"]
        hint = f" (did you mean {guess[0]}?)" if guess else ""
        if "." not in key and isinstance(value, dict):
            self.fail(None, f"unknown section [{key}]{hint}")
        if "." not in key and isinstance(value, list) and value and all(
            isinstance(v, dict) for v in value
        ):
            self.fail(None, f"unknown section [[{key}]]{hint}")
        self.fail(None, f"unknown key {key}{hint}")

    def section(self, name: str, value) -> dict:
        if not isinstance(value, dict):
            self.fail(name, f"must be a table ([{name}]), not {_show(value)}")
        return value

    def array(self, name: str, value) -> list[dict]:
        if isinstance(value, dict):
            self.fail(name, f"must be an array of tables ([[{name}]]), not a table ([{name}])")
        if not isinstance(value, list):
            self.fail(name, f"must be an array of tables ([[{name}]]), not {_show(value)}")
        for i, entry in enumerate(value):
            if not isinstance(entry, dict):
                self.fail(f"{name}[{i}]", f"must be a table, not {_show(entry)}")
        return value

    def table(self, table: dict, prefix: str, schema: dict) -> dict:
        """The checked values of ``table``, for the keys it has."""
        for key, value in table.items():
            if key not in schema:
                self.unknown(f"{prefix}.{key}", value, [f"{prefix}.{k}" for k in schema])
        for key, (_, required) in schema.items():
            if required and key not in table:
                self.fail(f"{prefix}.{key}", "required")
        out = {}
        for key, (check, _) in schema.items():
            if key in table:
                out[key] = self.value(f"{prefix}.{key}", table[key], check)
        return out

    def value(self, key: str, value, check):
        if check is None:
            return value
        try:
            return check(value)
        except _Bad as exc:
            self.fail(key, str(exc))

    def unique(self, entries: list[dict], name: str, key: str, fold=lambda v: v):
        seen: dict = {}
        for i, entry in enumerate(entries):
            if entry.get(key) is None:
                continue
            first = seen.setdefault(fold(entry[key]), i)
            if first != i:
                self.fail(f"{name}[{i}].{key}",
                          f"duplicate {_show(entry[key])} (also {name}[{first}])")

    def gpus(self, raw: list[dict]) -> tuple[GpuEntry, ...]:
        entries = [self.table(e, f"gpu[{i}]", _GPU) for i, e in enumerate(raw)]
        self.unique(entries, "gpu", "uuid", fold=str.lower)  # NVML's UUIDs ignore case
        self.unique(entries, "gpu", "alias")
        self.unique(entries, "gpu", "index")
        return tuple(GpuEntry(**e) for e in entries)

    def checks(self, raw: list[dict]) -> tuple[CheckEntry, ...]:
        entries = []
        for i, e in enumerate(raw):
            values = self.table(e, f"check[{i}]", _CHECK)
            self.check_type(f"check[{i}]", values)
            self.check_order(f"check[{i}]", values)
            entries.append(values)
        self.unique(entries, "check", "name")
        return tuple(CheckEntry(**e) for e in entries)

    def check_type(self, prefix: str, values: dict):
        kind = values["type"]
        if kind not in CHECK_TYPES:
            self.fail(f"{prefix}.type", f'must be "ram" or "disk", not {_show(kind)}')
        if kind == "ram" and "path" in values:
            self.fail(f"{prefix}.path", 'not allowed for type "ram"')
        if kind == "disk":
            if "path" not in values:
                self.fail(f"{prefix}.path", 'required for type "disk"')
            path = values["path"]
            if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
                self.fail(f"{prefix}.path", f"must be an absolute path, not {_show(path)}")

    def check_order(self, prefix: str, values: dict):
        """A stop level must be reached no later than its warn level would be."""
        for measure in ("free_gib", "free_pct"):
            warn, stop = values.get(f"warn_{measure}"), values.get(f"stop_{measure}")
            if warn is not None and stop is not None and stop > warn:
                self.fail(f"{prefix}.stop_{measure}",
                          f"must be at most warn_{measure} ({warn:g}), not {stop:g}")
        warn, stop = values.get("warn_used_pct"), values.get("stop_used_pct")
        if warn is not None and stop is not None and stop < warn:
            self.fail(f"{prefix}.stop_used_pct",
                      f"must be at least warn_used_pct ({warn:g}), not {stop:g}")

    def pools(self, raw: list[dict]) -> tuple[PoolEntry, ...]:
        entries = [self.table(e, f"pool[{i}]", _POOL) for i, e in enumerate(raw)]
        self.unique(entries, "pool", "name")
        return tuple(PoolEntry(**{**e, "unit": e.get("unit") or _unit_of(r["capacity"], e["name"])})
                     for e, r in zip(entries, raw))


# --- reloading ---------------------------------------------------------------------------

_RESTART = frozenset({"daemon.runtime_dir", "daemon.state_dir", "daemon.shared_dir",
                      "daemon.persist", "gpu", "pool", "slurm"})


def reload_changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """What differs from ``old`` to ``new``: (keys applied live, keys that need a restart).

    Keys are ``daemon.<name>`` for ``[daemon]``, ``gpu``, ``check``, ``pool`` for the
    arrays, ``slurm`` and ``metrics``, in that order.  The runtime directory, persistence, the set of
    GPUs and Slurm's share of them are fixed for the life of a daemon; everything else it
    can take on the fly.  ``[runner]`` and ``[mcp]`` are not the daemon's, and not compared.
    """
    changed = [
        f"daemon.{f.name}" for f in dataclasses.fields(DaemonConfig)
        if getattr(old.daemon, f.name) != getattr(new.daemon, f.name)
    ]
    for key, attr in (("gpu", "gpus"), ("check", "checks"), ("pool", "pools"), ("slurm", "slurm"),
                      ("metrics", "metrics")):
        if getattr(old, attr) != getattr(new, attr):
            changed.append(key)
    live = [k for k in changed if k not in _RESTART]
    restart = [k for k in changed if k in _RESTART]
    return live, restart
