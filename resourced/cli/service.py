"""gpuctl service enable/disable: install or remove the systemd unit and the bus files.

``resourced.linux.install`` decides what to write and run; this module does it, or prints it
(``--dry-run``). Files are written atomically, then the commands run in order, stopping at
the first failure. Where systemd is not running (a container, a chroot), the files are
still written or removed but no command runs, and gpuctl exits with EXIT_NO_SYSTEMD so
that a script does not go on as if the service were running.
"""

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click

from resourced.exits import EXIT_FAILURE, EXIT_NO_SYSTEMD, EXIT_USAGE, GpuctlError
from resourced.linux import install
from resourced.linux.users import user_name

# 9 is gpuctl's "still in use"; this belongs in _errors.py and the README's table.
# sd_booted(): this directory exists exactly when systemd is the running init.
SYSTEMD_RUNTIME = Path("/run/systemd/system")
LINGER_DIR = Path("/var/lib/systemd/linger")


def _mode_options(fn):
    fn = click.option("--system", "system", is_flag=True,
                      help="The system-wide service on the system bus (as root).")(fn)
    fn = click.option("--user", "user", is_flag=True,
                      help="The per-user service on your session bus.")(fn)
    fn = click.option("--dry-run", is_flag=True,
                      help="Print every file and command; change nothing.")(fn)
    # Stage the files under DIR instead of /, and never run a command (tests, packaging).
    return click.option("--root", type=click.Path(file_okay=False, path_type=Path),
                        hidden=True)(fn)


def _mode(user: bool, system: bool, shared: bool = False) -> str:
    if user == system:
        raise click.UsageError("choose one of --user or --system")
    if shared and not user:
        raise click.UsageError("--shared goes with --user: an ordinary account hosts it")
    return install.SHARED if shared else install.USER if user else install.SYSTEM


@click.group()
def service():
    """Install, enable or remove the systemd service.

    --user installs the user unit resourced.service for you alone (one person per machine);
    --system installs resourced.service, run by the 'resourced' account, for everyone;
    --user --shared DIR installs resourced-shared.service: you host a bus of its own in
    DIR for a group, without root (its members run `gpuctl connect DIR`).
    Exit 10 means systemd is not running: the files were written or removed, but the
    service was not started or stopped; the message says what to run later.

    Example: gpuctl service enable --user --dry-run
    """


@service.command()
@_mode_options
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="The daemon's config file (default: the daemon's own for --user, "
              f"{install.DEFAULT_SYSTEM_CONFIG} for --system).")
@click.option("--shared", "shared_dir", metavar="DIR", default=None,
              type=click.Path(file_okay=False),
              help="With --user: host a bus of its own in DIR for a group (no root).")
@click.option("--group", default=None,
              help="With --shared: the group that may use it (default: the config's "
              "access_group).")
def enable(user, system, dry_run, root, config, shared_dir, group):
    """Install the unit and bus files for this Python, then enable and start the service.

    The unit runs the interpreter that runs this command, so run it from the environment
    resourced is installed in (for --system: one the 'resourced' account can read, such
    as a virtualenv under /opt). Exit 10: systemd is not running, the files are written.

    \b
    Example: sudo /opt/resourced/bin/gpuctl service enable --system
    Example: gpuctl service enable --user --shared /srv/gpu-lab/resourced --group gpu-lab
    """
    mode = _mode(user, system, shared_dir is not None)
    if group is not None and mode != install.SHARED:
        raise click.UsageError("--group goes with --shared (the system service's group is "
                               "access_group in its config)")
    # Staged files are for another system: assume it has systemd-sysusers, as systemd does.
    sysusers = root is not None or shutil.which("systemd-sysusers") is not None
    config = os.path.abspath(config) if config else None
    if root is None:
        _check_config(config or (install.DEFAULT_SYSTEM_CONFIG if mode == install.SYSTEM
                                 else None), mode, dry_run)
    if mode == install.SHARED:
        group = group or ""  # the daemon's own access_group
    else:
        group = _access_group(config or install.DEFAULT_SYSTEM_CONFIG)
    plan = _plan(lambda: install.plan_enable(
        mode, sys.executable, config, root or "/", sysusers=sysusers, group=group,
        shared_dir=shared_dir and os.path.abspath(shared_dir)))
    if mode == install.SYSTEM and root is None:
        _plan(lambda: install.check_root_runs_only_roots_code(sys.executable, _code_dirs()))
    _carry_out(plan, dry_run=dry_run, staged=root is not None)
    if mode != install.SYSTEM and not dry_run and root is None:
        _note_lingering(mode == install.SHARED)


@service.command()
@_mode_options
@click.option("--shared", is_flag=True, help="With --user: the shared bus's service.")
def disable(user, system, dry_run, root, shared):
    """Stop and disable the service, then remove the files that enable wrote.

    The 'resourced' account and /var/lib/resourced stay. Exit 10: systemd is not running,
    the files are removed.

    Example: gpuctl service disable --user
    """
    mode = _mode(user, system, shared)
    _carry_out(_plan(lambda: install.plan_disable(mode, root or "/")),
               dry_run=dry_run, staged=root is not None)


def _check_config(path: str | None, mode: str, dry_run: bool) -> None:
    """The unit names this config file: it must be there and valid before anything is
    started, or the service fails at once and restarts in a loop."""
    from resourced.config import ConfigError, find_config, load_config

    if path is None:
        return  # the user service without --config: the daemon's own lookup, defaults at worst
    try:
        load_config(find_config(path))
    except ConfigError as exc:
        init = "sudo gpuctl init --system" if mode == install.SYSTEM else f"gpuctl init -o {path}"
        message = (f"{exc}; the service would fail at once: write it first (`{init}` lists "
                   "this machine's GPUs), or name another with --config")
        if not dry_run:
            raise GpuctlError(message, EXIT_USAGE) from exc
        click.echo(f"gpuctl: warning: {message}", err=True)


def _access_group(config_path: str) -> str:
    """The access group the daemon's config names (the default when there is no file)."""
    from resourced.config import ConfigError, load_config

    path = Path(config_path)
    try:
        return load_config(path if path.is_file() else None).daemon.access_group
    except ConfigError as exc:
        raise GpuctlError(str(exc), EXIT_USAGE) from exc


def _code_dirs() -> list[str]:
    """Where this environment's interpreter imports resourced and its packages from."""
    import sysconfig

    import resourced

    paths = sysconfig.get_paths()
    return list(dict.fromkeys([os.path.dirname(resourced.__file__), paths["purelib"],
                               paths["platlib"]]))


def _plan(make) -> install.Plan:
    try:
        return make()
    except install.InstallError as exc:
        raise GpuctlError(str(exc)) from exc


def _carry_out(plan: install.Plan, *, dry_run: bool, staged: bool) -> None:
    for note in plan.notes:
        click.echo(f"gpuctl: warning: {note}", err=True)
    running = SYSTEMD_RUNTIME.is_dir()
    if dry_run:
        _print_plan(plan, running or staged)
        return
    if plan.mode == install.SYSTEM and not staged and os.geteuid() != 0:
        raise GpuctlError("the system service is installed as root: run this with sudo")
    if running and not staged and plan.unit_path.exists():  # nothing to stop if not installed
        for cmd in plan.stop:
            _run(cmd)
    for f in plan.write:
        _write(f)
        click.echo(f"wrote {f.path}")
    for path in plan.remove:
        if _remove(path):
            click.echo(f"removed {path}")
    for directory in plan.prune:
        with contextlib.suppress(OSError):  # not empty, or not there: it stays as it is
            directory.rmdir()
            click.echo(f"removed {directory}/ (empty)")
    if staged:
        click.echo(f"not run (--root): {_joined((*plan.stop, *plan.commands))}")
        return
    if not running:
        change = "started (the files are written)" if plan.write else \
            "stopped (the files are removed)"
        raise GpuctlError(
            f"systemd is not running (no {SYSTEMD_RUNTIME}), so {plan.unit} was not {change}; "
            f"once it runs: {_joined(plan.commands)}",
            EXIT_NO_SYSTEMD,
        )
    for cmd in plan.commands:
        _run(cmd)
    click.echo(f"{plan.unit} is {'enabled and running' if plan.write else 'disabled'}")


def _joined(commands) -> str:
    return " && ".join(shlex.join(cmd) for cmd in commands)


def _print_plan(plan: install.Plan, would_run: bool) -> None:
    for cmd in plan.stop:
        click.echo(f"--- run: {shlex.join(cmd)}")
    for f in plan.write:
        click.echo(f"--- write {f.path} (mode {f.mode:04o})")
        click.echo(f.content, nl=False)
    for path in plan.remove:
        click.echo(f"--- remove {path}")
    for cmd in plan.commands:
        click.echo(f"--- run: {shlex.join(cmd)}")
    if not would_run:
        click.echo(f"--- systemd is not running here (no {SYSTEMD_RUNTIME}): without --dry-run "
                   f"the commands would not run (exit {EXIT_NO_SYSTEMD})")
    click.echo("--- dry run: nothing was changed")


def _write(f: install.FileToWrite) -> None:
    from resourced.linux.atomic_file import write_atomically

    try:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(f.path, f.content, f.mode)
    except OSError as exc:
        raise GpuctlError(f"cannot write {f.path}: {exc.strerror}") from exc


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise GpuctlError(f"cannot remove {path}: {exc.strerror}") from exc
    return True


def _run(cmd: install.Command) -> None:
    """Run one command; its failure ends gpuctl with the command's last line of error."""
    click.echo(f"running: {shlex.join(cmd)}")
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except OSError as exc:
        raise GpuctlError(f"cannot run {cmd[0]}: {exc.strerror}") from exc
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = f": {lines[-1].strip()}" if lines else ""
        raise GpuctlError(f"{shlex.join(cmd)} failed (exit {done.returncode}){why}", EXIT_FAILURE)


def _note_lingering(shared: bool) -> None:
    """A user service stops at logout unless lingering is on for the user."""
    name = user_name(os.getuid())
    if not SYSTEMD_RUNTIME.is_dir() or (LINGER_DIR / name).exists():
        return
    if shared:  # the host has no sudo, often; logind lets an active session linger itself
        click.echo(f"note: lingering is off, so the shared service stops when you log out; "
                   f"keep it running for the group with: loginctl enable-linger {name} (from "
                   "your own login session; if it is refused, ask an administrator)", err=True)
    else:
        click.echo(f"note: lingering is off, so the service stops when you log out; keep it "
                   f"running with: sudo loginctl enable-linger {name}", err=True)
