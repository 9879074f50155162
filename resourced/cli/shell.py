"""gpuctl shell: the interactive shell follows the user's active booking or claim.

``eval "$(gpuctl shell init bash)"`` (or zsh) defines ``gpuctl_refresh`` and a prompt hook.
The hook asks the daemon nothing while what it last heard is still valid: each prompt
compares ``$EPOCHSECONDS`` with ``_GPUCTL_VALID_UNTIL`` and reads the per-user stamp
(``resourced.linux.shell_stamp``) with the ``read`` builtin, no process started.  Only when the
validity has passed or the stamp changed (this user's gpuctl changed something) does it run
``gpuctl shell env`` and evaluate what that prints.

``gpuctl shell env`` decides, from one ``Describe`` and one ``ListBookings``: the active
booking (the latest started), else the newest granted development claim (those whose owner
lives first); one-off runs' claims belong to their command and are never chosen.  It prints
the claim's variables (``claim_env``, as ``gpuctl env``), the variables to take back, and:

* ``_GPUCTL_REF``: the claim chosen ('' for none);
* ``_GPUCTL_VALID_UNTIL``: epoch seconds, the earliest of the claim's end, the start of the
  user's next booking, and now + ``$RESOURCED_SHELL_RECHECK`` seconds (60), so that what
  others change (an administrator's cancel, a no-show release) is seen within that;
* ``_GPUCTL_STATE`` (exported, so a nested shell carries on): what the hook set and what
  each variable was before, so that when nothing is active any more the user's own values
  come back (``CUDA_VISIBLE_DEVICES=3`` set by hand) and the rest is unset.

A shell put on a claim by other means (``gpuctl run -- bash``, or ``eval "$(gpuctl env
...)"``: ``RESOURCED_ALLOCATION`` names a claim the hook did not set) is left alone, unless
that claim is the one the hook would choose anyway.

Times: the daemon's clock gives the remaining time (the simulated one in tests and
demos), which is then added to this machine's epoch seconds, the shell's clock.
"""

import json
import math
import os
import shlex
import sys
import time

import click

from resourced.protocol.names import JSON_SCHEMA
from resourced.protocol.time import Usec, now_usec, seconds_of_usec

from ._options import bus_option, emit_json, json_option

MANAGED = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RESOURCED_ALLOCATION", "RESOURCED_GPU_UUIDS",
    "RESOURCED_VRAM_BYTES", "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH",
    "RESOURCED_POOLS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)
"""Every variable ``claim_env`` may set: the hook sets or takes back only these."""

STATE_VARIABLE = "_GPUCTL_STATE"
RECHECK_VARIABLE = "RESOURCED_SHELL_RECHECK"
DEFAULT_RECHECK = 60
SHELL_TIMEOUT = 5.0
"""Seconds a refresh waits for the daemon: a hung daemon must not hold the prompt long."""
CHOSEN_MODES = ("booking", "dev")


def recheck_seconds(environ=os.environ) -> int:
    """``$RESOURCED_SHELL_RECHECK`` as whole seconds (at least 1), else 60."""
    try:
        return max(1, math.ceil(float(environ.get(RECHECK_VARIABLE, DEFAULT_RECHECK))))
    except ValueError:
        return DEFAULT_RECHECK


def choose(claims: list[dict], uid: int) -> dict | None:
    """The claim a shell of ``uid`` should be on: the active booking started last, else the
    newest granted development claim, those whose owner lives before dead ones."""
    mine = [c for c in claims
            if c["uid"] == uid and c["state"] == "granted" and c["mode"] in CHOSEN_MODES]
    bookings = [c for c in mine if c["mode"] == "booking"]
    if bookings:
        return max(bookings, key=lambda c: (c["created_usec"], c["id"]))
    if mine:
        return max(mine, key=lambda c: (bool(c["owner_alive"]), c["created_usec"], c["id"]))
    return None


def claim_variables(claim: dict, gpus: list[dict], use_index: bool) -> dict[str, str]:
    """The claim's environment, exactly as ``gpuctl env`` prints it, from a Describe
    record (the GPUs' memory from Describe's GPU list)."""
    from resourced.client.environment import claim_env

    memory = {g["uuid"]: g["memory_bytes"] for g in gpus}
    allocation = {
        "ref": claim["id"],
        "gpu_uuids": claim["gpu_uuids"],
        "pci_indices": claim["pci_indices"],
        "gpu_memory_bytes": [memory.get(u, 0) for u in claim["gpu_uuids"]],
        "vram_bytes": claim["vram_bytes"],
        "pools": claim["pools"],
    }
    return claim_env(allocation, use_index)


def next_start(bookings: list[dict]) -> int | None:
    """The start of the earliest booking still scheduled (usec), or None."""
    starts = [b["start_usec"] for b in bookings if b["state"] == "scheduled"]
    return min(starts) if starts else None


def valid_until(claim: dict | None, start: int | None, daemon_now: int, wall_now: float,
                recheck: int) -> int:
    """Epoch seconds (this machine's clock) until which nothing changes by itself: the
    claim's end or the next booking's start (on the daemon's clock, counted from its now),
    capped at ``recheck`` seconds; at least one second away (an instant already past is
    one the daemon is about to act on)."""
    left = float(recheck)
    for moment in ((claim or {}).get("until_usec") or None, start):
        if moment is not None:
            left = min(left, seconds_of_usec(moment - daemon_now))
    return int(wall_now) + max(1, math.ceil(left))


def read_state(environ=os.environ) -> dict:
    """``_GPUCTL_STATE``: {"set": {name: value the hook set}, "old": {name: value before}}."""
    try:
        state = json.loads(environ.get(STATE_VARIABLE, "") or "{}")
        set_, old = state.get("set", {}), state.get("old", {})
        if all(isinstance(v, str) for v in (*set_.values(), *old.values())):
            return {"set": dict(set_), "old": dict(old)}
    except (ValueError, AttributeError):
        pass
    return {"set": {}, "old": {}}


def foreign_claim(environ, state: dict, chosen_ref: str | None) -> str | None:
    """The claim this shell was put on by other means than the hook (None if none):
    ``RESOURCED_ALLOCATION`` set, not by the hook, and not to the claim it would choose."""
    current = environ.get("RESOURCED_ALLOCATION")
    if current and current != state["set"].get("RESOURCED_ALLOCATION") \
            and current != chosen_ref:
        return current
    return None


def transition(environ, state: dict, wanted: dict[str, str]) -> tuple[dict, list[str], dict]:
    """What to export, what to unset, and the new state, to go from the environment the
    hook left (``state``) to ``wanted`` (empty: none of the hook's variables).

    What the hook set and is still as it set it goes back to what it was before; a value
    the user changed since (or set while the hook held nothing) is the user's own, and
    comes back when the hook lets go.
    """
    names = [*MANAGED, *(n for n in wanted if n not in MANAGED),
             *(n for n in state["set"] if n not in MANAGED and n not in wanted)]
    export, unset, old = {}, [], {}
    for name in names:
        current = environ.get(name)
        if name in state["set"] and current == state["set"][name]:
            before = state["old"].get(name)
        elif name not in state["set"] and name in wanted and current == wanted[name] \
                and environ.get("RESOURCED_ALLOCATION") == wanted.get("RESOURCED_ALLOCATION"):
            before = None  # the shell already is on this claim (gpuctl env): adopted
        else:
            before = current
        target = wanted.get(name, before)
        if name in wanted and before is not None:
            old[name] = before
        if target is None:
            if current is not None or name in state["set"]:
                unset.append(name)
        elif target != current:
            export[name] = target
    new_state = {"set": dict(wanted), "old": old} if wanted else {"set": {}, "old": {}}
    return export, unset, new_state


def shell_lines(environ, state: dict, wanted: dict[str, str], ref: str,
                until: int) -> list[str]:
    """The lines ``gpuctl shell env`` prints for the hook to evaluate (POSIX quoting: bash
    and zsh alike)."""
    export, unset, new_state = transition(environ, state, wanted)
    lines = [f"export {name}={shlex.quote(value)}" for name, value in export.items()]
    if unset:
        lines.append("unset " + " ".join(unset))
    if new_state["set"]:
        text = json.dumps(new_state, sort_keys=True, separators=(",", ":"))
        lines.append(f"export {STATE_VARIABLE}={shlex.quote(text)}")
    else:
        lines.append(f"unset {STATE_VARIABLE}")
    lines.append(f"_GPUCTL_REF={shlex.quote(ref)}")
    lines.append(f"_GPUCTL_VALID_UNTIL={until}")
    return lines


@click.group()
def shell():
    """Keep an interactive shell on your active booking or claim.

    Put `eval "$(gpuctl shell init bash)"` (or zsh) in your shell's rc file: at each
    prompt CUDA_VISIBLE_DEVICES and the other variables of `gpuctl env` follow your
    active booking, else your newest development claim, and go when it ends.

    Example: eval "$(gpuctl shell init zsh)"
    """


@shell.command(short_help="Print the hook for bash or zsh, to eval in the shell's rc file.")
@click.argument("kind", metavar="bash|zsh")
@click.option("--index", "use_index", is_flag=True,
              help="CUDA_VISIBLE_DEVICES as PCI-ordered indices instead of UUIDs.")
@bus_option
def init(kind, use_index, bus):
    """Print the code that puts this shell's prompt on your active booking or claim.

    It defines `gpuctl_refresh` (ask the daemon now) and a prompt hook that asks only
    when something changed: a gpuctl command of yours changed something, the claim ended,
    a booking of yours starts, or $RESOURCED_SHELL_RECHECK seconds (60) have passed.

    Example: eval "$(gpuctl shell init bash)"
    """
    from resourced.linux.shell_stamp import stamp_path

    templates = {"bash": BASH, "zsh": ZSH}
    if kind not in templates:
        raise click.UsageError(f"no shell hook for {kind!r}: bash and zsh have one"
                               + (" (fish: not yet)" if kind == "fish" else ""))
    command = [sys.executable, "-P", "-m", "resourced.cli", "shell", "env"]
    command += (["--bus", bus] if bus else []) + (["--index"] if use_index else [])
    code = templates[kind]
    for key, value in (("@STAMP@", shlex.quote(str(stamp_path()))),
                       ("@COMMAND@", shlex.join(command)),
                       ("@RETRY@", str(recheck_seconds()))):
        code = code.replace(key, value)
    click.echo(code, nl=False)


@shell.command(name="env", short_help="What the hook evaluates: your active claim's "
               "variables, and until when.")
@click.option("--index", "use_index", is_flag=True,
              help="CUDA_VISIBLE_DEVICES as PCI-ordered indices instead of UUIDs.")
@bus_option
@json_option
def env_(use_index, bus, as_json):
    """Print what the shell hook evaluates: the variables of your active booking or claim
    (or the lines taking them back), the claim chosen and until when that holds.

    --json says the choice: ref and mode ('' when none), env, valid_until (epoch seconds).

    Example: gpuctl shell env --json
    """
    from resourced.client.sync import Client

    with Client(bus=bus, timeout=SHELL_TIMEOUT) as c:
        view = c.status()
        daemon_now = now_usec()
        bookings = c.bookings(since=Usec(daemon_now))
    chosen = choose(view["claims"], os.getuid())
    wanted = claim_variables(chosen, view["gpus"], use_index) if chosen else {}
    ref = chosen["id"] if chosen else ""
    until = valid_until(chosen, next_start(bookings), daemon_now, time.time(),
                        recheck_seconds())
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "ref": ref, "mode": chosen["mode"] if chosen else "", "env": wanted,
                   "valid_until": until})
        return
    state = read_state()
    other = foreign_claim(os.environ, state, ref or None)
    if other:
        click.echo(f"gpuctl: this shell is on claim {other} (RESOURCED_ALLOCATION, set by "
                   "gpuctl env or run): the hook leaves it alone", err=True)
        click.echo(f"_GPUCTL_REF=\n_GPUCTL_VALID_UNTIL={until}")
        return
    click.echo("\n".join(shell_lines(os.environ, state, wanted, ref, until)))


# The hooks.  No process is started at a prompt unless something changed: EPOCHSECONDS
# (bash 5, zsh/datetime) or printf's %(%s)T (bash 4.2+), the stamp read with `read`.
# gpuctl_refresh says why it failed; the prompt stays quiet and retries after @RETRY@ s.
BASH = r"""# gpuctl shell init bash: this shell follows your active booking or claim (resourced)
_GPUCTL_STAMP=@STAMP@
_GPUCTL_SEEN=
_GPUCTL_REF=
_GPUCTL_VALID_UNTIL=0
_gpuctl_update() {
    local _gpuctl_out _gpuctl_rc _gpuctl_t
    _GPUCTL_SEEN=
    { read -r _GPUCTL_SEEN < "$_GPUCTL_STAMP"; } 2>/dev/null || :
    if _gpuctl_out=$(@COMMAND@); then
        eval "$_gpuctl_out"
    else
        _gpuctl_rc=$?
        printf -v _gpuctl_t '%(%s)T' -1
        _GPUCTL_VALID_UNTIL=$((_gpuctl_t + @RETRY@))
        return "$_gpuctl_rc"
    fi
}
gpuctl_refresh() { _gpuctl_update; }
if (( BASH_VERSINFO[0] >= 5 )); then
    _gpuctl_prompt() {
        local _gpuctl_rc=$? _gpuctl_seen=
        { read -r _gpuctl_seen < "$_GPUCTL_STAMP"; } 2>/dev/null || :
        if (( EPOCHSECONDS >= _GPUCTL_VALID_UNTIL )) || [[ $_gpuctl_seen != "$_GPUCTL_SEEN" ]]
        then
            _gpuctl_update 2>/dev/null || :
        fi
        return "$_gpuctl_rc"
    }
else
    _gpuctl_prompt() {
        local _gpuctl_rc=$? _gpuctl_seen= _gpuctl_t
        printf -v _gpuctl_t '%(%s)T' -1
        { read -r _gpuctl_seen < "$_GPUCTL_STAMP"; } 2>/dev/null || :
        if (( _gpuctl_t >= _GPUCTL_VALID_UNTIL )) || [[ $_gpuctl_seen != "$_GPUCTL_SEEN" ]]
        then
            _gpuctl_update 2>/dev/null || :
        fi
        return "$_gpuctl_rc"
    }
fi
case "${PROMPT_COMMAND[*]-}" in
    *_gpuctl_prompt*) ;;  # evaluated twice
    *)
        if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )) \
                && [[ ${PROMPT_COMMAND@a} == *a* ]]; then
            PROMPT_COMMAND=(_gpuctl_prompt "${PROMPT_COMMAND[@]}")
        else
            PROMPT_COMMAND=_gpuctl_prompt${PROMPT_COMMAND:+$'\n'$PROMPT_COMMAND}
        fi
        ;;
esac
"""

ZSH = r"""# gpuctl shell init zsh: this shell follows your active booking or claim (resourced)
zmodload zsh/datetime
typeset -g _GPUCTL_STAMP=@STAMP@ _GPUCTL_SEEN= _GPUCTL_REF=
typeset -g _GPUCTL_VALID_UNTIL=0
_gpuctl_update() {
    local _gpuctl_out _gpuctl_rc
    _GPUCTL_SEEN=
    { read -r _GPUCTL_SEEN < "$_GPUCTL_STAMP"; } 2>/dev/null || :
    if _gpuctl_out=$(@COMMAND@); then
        eval "$_gpuctl_out"
    else
        _gpuctl_rc=$?
        _GPUCTL_VALID_UNTIL=$(( EPOCHSECONDS + @RETRY@ ))
        return $_gpuctl_rc
    fi
}
gpuctl_refresh() { _gpuctl_update; }
_gpuctl_prompt() {
    local _gpuctl_seen=
    { read -r _gpuctl_seen < "$_GPUCTL_STAMP"; } 2>/dev/null || :
    if (( EPOCHSECONDS >= _GPUCTL_VALID_UNTIL )) || [[ $_gpuctl_seen != "$_GPUCTL_SEEN" ]]; then
        _gpuctl_update 2>/dev/null || :
    fi
    return 0
}
typeset -ga precmd_functions
precmd_functions=(_gpuctl_prompt ${precmd_functions:#_gpuctl_prompt})
"""
