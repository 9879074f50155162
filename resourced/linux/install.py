"""What `gpuctl service enable/disable` writes, removes and runs: a plan, made without side effects.

The unit, bus and polkit files live in the source tree (``systemd/``, ``dbus/``,
``polkit/``) as templates. ``plan_enable`` fills in the interpreter, the config path and
the README the units' Documentation= names, and says where each file goes;
``plan_disable`` is its inverse. Nothing here writes a file or runs a command: the CLI
(``resourced.cli.service``) does, or prints the plan with ``--dry-run``.

Every destination is given for the target system and prefixed with ``root`` (``/`` unless
staging into a directory), while the commands always name the target's own paths, since
they are meant to run there.
"""

import grp
import os
import pwd
import re
import shlex
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from resourced.protocol.names import ACCOUNT

from .xdg import base_dir

USER = "user"
SYSTEM = "system"
SHARED = "shared"  # a user service hosting a bus of its own for a group (--user --shared)
MODES = (USER, SYSTEM, SHARED)

SYSTEM_UNIT = "resourced.service"
USER_UNIT = "resourced.service"  # the predecessor's name: its systemctl and journalctl lines work
# (its template is systemd/resourced-user.service, beside the system unit of the same name)
NOTIFY_UNIT = "resourced-notify.service"  # written, never enabled: each user's own choice
RUNNER_UNIT = "resourced-runner.service"  # started with the user service (system: each user's choice)
SHARED_UNIT = "resourced-shared.service"
ISOLATION_UNIT = "resourced-isolation.service"  # root, bus-activated: never enabled
DEFAULT_SYSTEM_CONFIG = "/etc/resourced/config.toml"
SYSUSERS_CONF = "/etc/sysusers.d/resourced.conf"
README = "README.md"  # beside the templates: the units' Documentation=
MAN_PAGES = (("gpuctl", 1), ("resourced-mcp", 1), ("resourced.conf", 5), ("resourced", 8))
"""The generated man pages (``python -m resourced.docs``) under docs/man/, by page and
section."""

Command = tuple[str, ...]

# How a value is written into a template: systemd's ExecStart= rules, or the shell-like
# rules of a D-Bus service file's Exec=. Files without placeholders use PLAIN.
UNIT, DBUS, PLAIN, RULES = "unit", "dbus", "plain", "rules"

PLACEHOLDER = re.compile(r"@([A-Z][A-Z_]*)@")


@dataclass(frozen=True)
class Template:
    source: str  # relative to the source tree
    target: str  # absolute path on the target; user files start with $CONFIG or $DATA
    syntax: str = PLAIN


SYSTEM_FILES = (
    Template("systemd/resourced.service", f"/etc/systemd/system/{SYSTEM_UNIT}", UNIT),
    # The local administrator's places where they exist: /etc/dbus-1/system.d for the bus
    # policy, /etc/sysusers.d for the account, /etc/systemd for units. The activation file
    # and the polkit actions have only /usr/share (dbus-daemon and polkitd read no /etc
    # directory for those).
    Template("dbus/org.resourced.conf", "/etc/dbus-1/system.d/org.resourced.conf"),
    Template("dbus/org.resourced.service",
             "/usr/share/dbus-1/system-services/org.resourced.service"),
    Template(f"systemd/{ISOLATION_UNIT}", f"/etc/systemd/system/{ISOLATION_UNIT}", UNIT),
    Template("dbus/org.resourced.Isolation.service",
             "/usr/share/dbus-1/system-services/org.resourced.Isolation.service"),
    Template("systemd/resourced.sysusers", SYSUSERS_CONF),
    Template(f"systemd/{NOTIFY_UNIT}", f"/etc/systemd/user/{NOTIFY_UNIT}", UNIT),
    Template(f"systemd/{RUNNER_UNIT}", f"/etc/systemd/user/{RUNNER_UNIT}", UNIT),
    # The man pages, where the local administrator's go: `man gpuctl` for every user, and
    # the units' Documentation=man:... for systemctl help.
    *(Template(f"docs/man/man{section}/{page}.{section}",
               f"/usr/local/share/man/man{section}/{page}.{section}")
      for page, section in MAN_PAGES),
)
POLKIT_FILES = (
    Template("polkit/org.resourced.policy", "/usr/share/polkit-1/actions/org.resourced.policy"),
    # In /etc, not /usr/share: the group in it is this machine's choice (access_group).
    Template("polkit/50-resourced.rules", "/etc/polkit-1/rules.d/50-resourced.rules", "rules"),
)
GROUP_NAME = re.compile(r"^[a-z_][a-z0-9_-]*\$?$")

USER_FILES = (
    Template("systemd/resourced-user.service", f"$CONFIG/systemd/user/{USER_UNIT}", UNIT),
    Template("dbus/org.resourced.session.service",
             "$DATA/dbus-1/services/org.resourced.service", DBUS),
    Template(f"systemd/{NOTIFY_UNIT}", f"$CONFIG/systemd/user/{NOTIFY_UNIT}", UNIT),
    Template(f"systemd/{RUNNER_UNIT}", f"$CONFIG/systemd/user/{RUNNER_UNIT}", UNIT),
    # Where man finds them for a ~/.local/bin on PATH (uv tool install, pipx): the wheel's
    # own share/man stays inside the tool's environment.
    *(Template(f"docs/man/man{section}/{page}.{section}",
               f"$DATA/man/man{section}/{page}.{section}") for page, section in MAN_PAGES),
)
SHARED_FILES = (
    Template(f"systemd/{SHARED_UNIT}", f"$CONFIG/systemd/user/{SHARED_UNIT}", UNIT),
)

# Where enable may have to make the directory (Debian 12 has no /etc/sysusers.d and an
# empty /usr/local/share/man; a new user has no ~/.config/systemd/user,
# ~/.local/share/dbus-1/services or ~/.local/share/man): disable drops these again when
# they are left empty, and no other.
SYSTEM_MADE_DIRS = frozenset({"sysusers.d", "man1", "man5", "man8"})
USER_MADE_DIRS = frozenset({"user", "services", "man1", "man5", "man8"})

# Directories that ProtectHome=yes hides from the system service.
_HIDDEN_FROM_SYSTEM_SERVICE = ("/home", "/root", "/run/user")
_ELSEWHERE = {
    "interpreter": "install resourced in a virtualenv under /opt and run this from there",
    "config file": f"use a config file outside it, such as {DEFAULT_SYSTEM_CONFIG}",
}

# dbus-daemon notices new policy files by itself (inotify), but asynchronously, and
# dbus-broker not at all; ReloadConfig is synchronous on both, so the policy is in force
# before the unit starts and asks for the name.
_RELOAD_BUS_POLICY: Command = (
    "busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
    "ReloadConfig",
)
_USERADD = (
    f"getent passwd {ACCOUNT} >/dev/null || useradd --system --user-group --home-dir / "
    f"--no-create-home --shell /usr/sbin/nologin --comment 'resourced daemon' {ACCOUNT}"
)


class InstallError(Exception):
    """The plan cannot be made: a bad path, or the templates are missing."""


@dataclass(frozen=True)
class FileToWrite:
    path: Path
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class Plan:
    """What to do, in this order: ``stop``, then ``write`` and ``remove``, then ``commands``."""

    mode: str
    unit: str  # the systemd unit's name
    unit_path: Path  # where its file is (under root): present means installed
    write: tuple[FileToWrite, ...] = ()
    remove: tuple[Path, ...] = ()
    stop: tuple[Command, ...] = ()  # while the unit file still exists (disable)
    commands: tuple[Command, ...] = ()
    notes: tuple[str, ...] = ()  # warnings for the person installing
    prune: tuple[Path, ...] = ()  # after ``remove``: directories to drop if left empty


def plan_enable(
    mode: str,
    python: str,
    config: str | None = None,
    root: str | os.PathLike = "/",
    *,
    env: Mapping[str, str] | None = None,
    sources: Path | None = None,
    sysusers: bool = True,
    group: str = ACCOUNT,
    shared_dir: str | None = None,
) -> Plan:
    """The files and commands that install, enable and start the service.

    ``python`` is the interpreter for ExecStart (normally ``sys.executable``: the unit runs
    the environment resourced is installed in). ``config`` defaults to
    /etc/resourced/config.toml for the system service and to none (the daemon's default)
    for the user service. ``sysusers=False`` creates the account with useradd instead.
    ``group`` is the access group the polkit rule grants the everyday actions to (for
    SHARED: the group of the bus, ``""`` for the daemon's own ``access_group``), and
    ``shared_dir`` the directory of a SHARED bus.
    """
    _check_mode(mode)
    if not GROUP_NAME.match(group) and not (mode == SHARED and group == ""):
        raise InstallError(f"{group!r} is not a valid group name")
    python = _absolute("interpreter", python)
    sources = sources or source_dir()
    # A file: URL percent-encodes what a unit would have to quote ($, spaces, quotes).
    values = {"PYTHON": [python], "README": [(sources / README).absolute().as_uri()]}
    if mode == SYSTEM:
        config = _absolute("config file", config or DEFAULT_SYSTEM_CONFIG)
        values |= {"CONFIG": [config], "GROUP": [group]}
    else:
        config = _absolute("config file", config) if config else None
        values["CONFIG_OPTION"] = ["--config", config] if config else []
    if mode == SHARED:
        values["DIR"] = [_absolute("shared bus directory", shared_dir or "")]
        values["GROUP_OPTION"] = ["--group", group] if group else []
    files = tuple(
        FileToWrite(_under(root, target), render(_read(sources, t.source), values, t.syntax))
        for t, target in _targets(mode, env)
    )
    if mode == SYSTEM:
        account = ("systemd-sysusers", SYSUSERS_CONF) if sysusers else ("sh", "-c", _USERADD)
        commands = (account, _RELOAD_BUS_POLICY, ("systemctl", "daemon-reload"),
                    ("systemctl", "enable", "--now", SYSTEM_UNIT))
    elif mode == SHARED:
        commands = (("systemctl", "--user", "daemon-reload"),
                    ("systemctl", "--user", "enable", "--now", SHARED_UNIT))
    else:
        commands = (("systemctl", "--user", "daemon-reload"),
                    ("systemctl", "--user", "enable", "--now", USER_UNIT, RUNNER_UNIT))
    # The unit file comes first in every file table.
    return Plan(mode, _unit(mode), files[0].path, write=files, commands=commands,
                notes=_notes(mode, python, config))


def plan_disable(
    mode: str, root: str | os.PathLike = "/", *, env: Mapping[str, str] | None = None
) -> Plan:
    """The inverse of ``plan_enable``: stop and disable the unit, then remove its files.

    The service account and its state (/var/lib/resourced) stay, as a package's would.
    """
    _check_mode(mode)
    paths = tuple(_under(root, target) for _, target in _targets(mode, env))
    # Directories enable may have made (none of a package's): dropped again when empty.
    made = SYSTEM_MADE_DIRS if mode == SYSTEM else USER_MADE_DIRS
    prune = tuple(dict.fromkeys(p.parent for p in paths if p.parent.name in made))
    if mode == SYSTEM:
        stop = (("systemctl", "disable", "--now", SYSTEM_UNIT),
                ("systemctl", "stop", ISOLATION_UNIT))
        commands = (("systemctl", "daemon-reload"), _RELOAD_BUS_POLICY)
    elif mode == SHARED:
        stop = (("systemctl", "--user", "disable", "--now", SHARED_UNIT),)
        commands = (("systemctl", "--user", "daemon-reload"),)
    else:
        stop = (("systemctl", "--user", "disable", "--now", USER_UNIT, RUNNER_UNIT,
                 NOTIFY_UNIT),)
        commands = (("systemctl", "--user", "daemon-reload"),)
    return Plan(mode, _unit(mode), paths[0], remove=paths, stop=stop, commands=commands,
                prune=prune)


def unit_name(mode: str) -> str:
    _check_mode(mode)
    return _unit(mode)


def unit_path(mode: str, root: str | os.PathLike = "/", *,
              env: Mapping[str, str] | None = None) -> Path:
    """Where ``mode``'s unit file goes (the first of its files)."""
    _check_mode(mode)
    return _under(root, _targets(mode, env)[0][1])


def installed_modes(root: str | os.PathLike = "/", *, env: Mapping[str, str] | None = None
                    ) -> list[str]:
    """The modes whose unit file is in place (``gpuctl doctor``)."""
    return [mode for mode in MODES if unit_path(mode, root, env=env).is_file()]


def drift(mode: str, root: str | os.PathLike = "/", *, env: Mapping[str, str] | None = None,
          sources: Path | None = None) -> list[tuple[Path, str]]:
    """What differs from what ``plan_enable`` writes for ``mode``: (path, problem) for each
    file missing or changed.  A placeholder's value (interpreter, config, group) may be any
    that enable could have written; the rest must be as the template has it."""
    sources = sources or source_dir()
    found = []
    for template, target in _targets(mode, env):
        path = _under(root, target)
        try:
            written = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            found.append((path, "missing"))
            continue
        except (OSError, UnicodeDecodeError) as exc:
            found.append((path, f"unreadable ({getattr(exc, 'strerror', None) or exc})"))
            continue
        wanted = _read(sources, template.source).splitlines()
        for number, (line, pattern) in enumerate(zip(written, wanted), 1):
            if not _line_pattern(pattern, template.syntax).fullmatch(line.rstrip()):
                found.append((path, f"line {number} differs from the template {template.source}"))
                break
        else:
            if len(written) != len(wanted):
                found.append((path, f"has {len(written)} lines where the template "
                              f"{template.source} has {len(wanted)}"))
    return found


def _line_pattern(line: str, syntax: str) -> re.Pattern:
    """A template line as a pattern: each placeholder any text (an empty value takes the
    space before it too, as ``render`` leaves it)."""
    if syntax == PLAIN:
        return re.compile(re.escape(line.rstrip()))
    parts = re.split(r"( ?@[A-Z][A-Z_]*@)", line.rstrip())
    return re.compile("".join(
        ("(?: .*)?" if part.startswith(" ") else ".*") if PLACEHOLDER.fullmatch(part.strip())
        else re.escape(part) for part in parts))


def render(text: str, values: Mapping[str, list[str]], syntax: str) -> str:
    """``text`` with each ``@NAME@`` replaced by the words ``values[NAME]``, quoted for ``syntax``."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if syntax == PLAIN or name not in values:
            raise InstallError(f"template placeholder @{name}@ has no value")
        quote = {UNIT: _unit_word, DBUS: shlex.quote, RULES: str}[syntax]
        return " ".join(quote(word) for word in values[name])

    rendered = PLACEHOLDER.sub(replace, text)
    # An empty value (no --config) would leave a trailing space behind.
    return "".join(line.rstrip() + "\n" for line in rendered.splitlines())


def source_dir() -> Path:
    """The directory holding ``systemd/``, ``dbus/``, ``polkit/`` and the README: the source
    tree resourced runs from (an editable install), else ``<prefix>/share/resourced``, where
    a wheel puts them."""
    candidates = (Path(__file__).resolve().parents[2], Path(sys.prefix, "share", "resourced"))
    for candidate in candidates:
        if (candidate / SYSTEM_FILES[0].source).is_file():
            return candidate
    raise InstallError(
        "cannot find the unit templates (systemd/, dbus/) in "
        + " or ".join(str(c) for c in candidates)
        + ": install resourced from its source tree (pip install -e)"
    )


def user_dirs(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """$XDG_CONFIG_HOME and $XDG_DATA_HOME, with the XDG defaults (relative values are ignored)."""
    env = os.environ if env is None else env
    return {"CONFIG": base_dir("XDG_CONFIG_HOME", env), "DATA": base_dir("XDG_DATA_HOME", env)}


def _targets(mode: str, env: Mapping[str, str] | None) -> list[tuple[Template, str]]:
    if mode == SYSTEM:
        return [(t, _target(t)) for t in (*SYSTEM_FILES, *POLKIT_FILES)]
    dirs = user_dirs(env)
    return [(t, _target(t, dirs)) for t in (SHARED_FILES if mode == SHARED else USER_FILES)]


def _target(template: Template, dirs: Mapping[str, str] | None = None) -> str:
    head, sep, rest = template.target.partition("/")
    if head.startswith("$"):
        return dirs[head[1:]] + sep + rest
    return template.target


def _under(root: str | os.PathLike, target: str) -> Path:
    return Path(root, target.lstrip("/"))


def _read(sources: Path, name: str) -> str:
    try:
        return (sources / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise InstallError(f"cannot read the template {sources / name}: {exc.strerror}") from exc


def _unit(mode: str) -> str:
    return {SYSTEM: SYSTEM_UNIT, USER: USER_UNIT, SHARED: SHARED_UNIT}[mode]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise InstallError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")


def check_root_runs_only_roots_code(python: str, code: Iterable[str]) -> None:
    """Refuse (InstallError) a root unit that would run ``python``, loading ``code`` (the
    folders it imports from), when an account other than root can change any of them or
    a folder above: that account could run code as root."""
    for path in (python, *code):
        found = changeable_by_others(path)
        if found:
            where, who = found
            raise InstallError(
                f"{where} is {who}, and the root unit {ISOLATION_UNIT} would run "
                f"{python} with code from {path}: that account could run code as root. "
                "Install resourced where only root can write (as root: python3 -m venv "
                "/opt/resourced, then /opt/resourced/bin/pip install resourced's source) "
                "and run this from there")


def changeable_by_others(path: str) -> tuple[str, str] | None:
    """The first of ``path``, what it links to, and the folders above them that an
    account other than root can change, and how: (path, "owned by ..." or "writable by
    ..."), or None.  A sticky folder (/tmp) is safe for what root owns in it."""
    seen: set[str] = set()
    for start in (os.path.abspath(path), os.path.realpath(path)):
        current = start
        while current not in seen:
            seen.add(current)
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISLNK(st.st_mode):
                sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
                if st.st_uid != 0:
                    return current, f"owned by {_account(st.st_uid)}"
                if st.st_mode & 0o002 and not sticky:
                    return current, "writable by everyone"
                if st.st_mode & 0o020 and st.st_gid != 0 and not sticky:
                    return current, f"writable by group {_group(st.st_gid)}"
            current = os.path.dirname(current)
    return None


def _account(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def _absolute(what: str, path: str) -> str:
    path = os.fspath(path)
    if not os.path.isabs(path):  # (an empty one too)
        raise InstallError(f"the {what} path must be absolute: {path}")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise InstallError(f"the {what} path holds a control character: {path!r}")
    return path


def _unit_word(word: str) -> str:
    """One word of a systemd command line: % and $ are specifiers and variables there."""
    word = word.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def _notes(mode: str, python: str, config: str | None) -> tuple[str, ...]:
    if mode != SYSTEM:
        return ()
    notes = []
    for what, path in (("interpreter", python), ("config file", config)):
        hidden = [d for d in _HIDDEN_FROM_SYSTEM_SERVICE if path == d or path.startswith(d + "/")]
        if hidden:
            notes.append(
                f"the {what} {path} is under {hidden[0]}, which the system service cannot "
                f"see (ProtectHome=yes): {_ELSEWHERE[what]}, or the service will not start"
            )
    return tuple(notes)
