"""The notification agent's pure part: which Notify or CloseNotification for each change."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resourced.core.health import ERROR, NOT_MEASURED, OK, STOP, UNAVAILABLE, WARN
from resourced.notify.service import (
    BOOKINGS,
    OPENS_KEPT,
    RESOURCES,
    Blackouts,
    Bubbles,
    Close,
    Launcher,
    Show,
    blackout_message,
    check_label,
    gpuctl_command,
    plain_words,
    spawn_detached,
    terminal_command,
)

from ..conftest import assert_systemd_accepts


def shown(bubbles: Bubbles, action: Show, notification_id: int) -> Show:
    bubbles.shown(action, notification_id)
    return action


def test_stop_shows_a_critical_bubble_that_stays():
    b = Bubbles()
    b.labels["data"] = "disk /data"
    action = b.level_changed("data", STOP, "free 9.5G <= stop_free_gib 10")
    assert isinstance(action, Show)
    assert (action.replaces_id, action.urgency, action.expire_timeout) == (0, 2, 0)
    assert action.summary == "Disk /data is full"
    assert action.body == "9.5G free; the limit is 10G free. Jobs should stop writing to it."


def test_warn_and_failures_show_with_normal_urgency():
    b = Bubbles()
    for level in (WARN, ERROR, UNAVAILABLE):
        action = b.level_changed(f"c-{level}", level, "why")
        assert (action.urgency, action.expire_timeout, action.replaces_id) == (1, -1, 0)
        assert action.summary == (f"c-{level} is near its limit" if level == WARN
                                  else f"c-{level} cannot be measured")


@pytest.mark.parametrize("label, level, reason, summary, body", [
    ("disk /data", WARN, "used 84.4% >= warn_used_pct 80", "Disk /data is filling up",
     "84.4% used; the warning is at 80% used. Nothing is stopped yet."),
    ("ram", STOP, "free 3.0% <= stop_free_pct 5", "RAM is nearly exhausted",
     "3.0% free; the limit is 5% free. Jobs should not start anything large."),
    ("ram (host)", UNAVAILABLE, "no answer for 12 s", "RAM (host) cannot be measured",
     "no answer for 12 s"),
    ("disk /x", WARN, "a reason of another shape", "Disk /x is filling up",
     "a reason of another shape"),
    ("scratch", STOP, "free 2G <= stop_free_gib 5", "scratch has reached its limit",
     "2G free; the limit is 5G free."),
])
def test_bubbles_speak_plain_words(label, level, reason, summary, body):
    assert plain_words(label, level, reason) == (summary, body)


def test_a_change_replaces_the_bubble_in_place():
    b = Bubbles()
    shown(b, b.level_changed("data", STOP, "full"), 7)
    action = b.level_changed("data", WARN, "nearly full")
    assert (action.replaces_id, action.urgency) == (7, 1)
    shown(b, action, 7)
    assert b.ids == {"data": 7}


def test_ok_closes_the_bubble_once():
    b = Bubbles()
    shown(b, b.level_changed("data", WARN, "x"), 7)
    assert b.level_changed("data", OK, "fine") == Close("data", 7)
    assert b.ids == {}
    assert b.level_changed("data", OK, "fine") is None


def test_ok_without_a_bubble_does_nothing():
    assert Bubbles().level_changed("ram", OK, "fine") is None


def test_one_bubble_per_check():
    b = Bubbles()
    shown(b, b.level_changed("ram", WARN, "x"), 1)
    action = b.level_changed("data", STOP, "y")
    assert action.replaces_id == 0
    shown(b, action, 2)
    assert b.ids == {"ram": 1, "data": 2}
    assert b.level_changed("ram", OK, "") == Close("ram", 1)
    assert b.ids == {"data": 2}


def test_the_same_level_and_reason_again_does_not_pop_up_again():
    b = Bubbles()
    shown(b, b.level_changed("data", WARN, "x"), 3)
    assert b.level_changed("data", WARN, "x") is None
    assert b.level_changed("data", WARN, "y").replaces_id == 3


def test_a_bubble_closed_by_the_server_is_forgotten():
    b = Bubbles()
    shown(b, b.level_changed("data", WARN, "x"), 3)
    b.closed(99)
    assert b.ids == {"data": 3}
    b.closed(3)
    assert b.ids == {}
    assert b.level_changed("data", STOP, "y").replaces_id == 0


def test_a_new_notification_server_gets_no_stale_ids():
    b = Bubbles()
    shown(b, b.level_changed("data", WARN, "x"), 3)
    b.forget_all()
    assert b.level_changed("data", STOP, "y").replaces_id == 0
    assert b.level_changed("ram", OK, "") is None


def test_resync_shows_what_is_not_ok_and_closes_what_is():
    b = Bubbles()
    shown(b, b.level_changed("data", STOP, "full"), 4)
    shown(b, b.level_changed("old", WARN, "x"), 5)
    shown(b, b.level_changed("same", WARN, "w"), 6)
    actions = b.resync({"data": (OK, "fine"), "ram": (WARN, "low"), "same": (WARN, "w"),
                        "new": (UNAVAILABLE, NOT_MEASURED)})
    closes = [a for a in actions if isinstance(a, Close)]
    shows = [a for a in actions if isinstance(a, Show)]
    assert sorted(closes, key=lambda c: c.id) == [Close("data", 4), Close("old", 5)]
    assert [(s.check, s.level, s.replaces_id) for s in shows] == [("ram", WARN, 0)]


def test_labels():
    assert check_label("data", "disk", "/data") == "disk /data"
    assert check_label("ram", "ram") == "ram"
    assert check_label("memory", "ram") == "ram (memory)"
    assert check_label("mystery") == "mystery"


def test_gpuctl_notify_and_resources_help_load_no_bus_library():
    probe = ("import sys; from resourced.cli import main; "
             "rcs = [main(['notify', '--help']), main(['resources', '--help'])]; "
             "print(rcs, [m for m in ('dbus_fast', 'jeepney', 'asyncio') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30, check=True)
    assert done.stdout.splitlines()[-1] == "[0, 0] []"


def test_systemd_accepts_the_agents_user_unit(tmp_path):
    template = Path(__file__).resolve().parents[2] / "systemd" / "resourced-notify.service"
    text = template.read_text()
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    for setting in ("Type=exec", "ExecStart=@PYTHON@ -m resourced.cli notify",
                    "Restart=on-failure", "PartOf=graphical-session.target",
                    "After=graphical-session.target", "WantedBy=graphical-session.target"):
        assert setting in settings
    readme = (template.parents[1] / "README.md").as_uri()
    assert_systemd_accepts(tmp_path, "resourced-notify.service",
                           text.replace("@PYTHON@", sys.executable).replace("@README@", readme))


def test_calendar_messages_say_what_happened_to_a_booking_in_words():
    from resourced.client.bookings import record as read_booking
    from resourced.notify.service import calendar_message

    # as the agent reads BookingChanged's a{sv}: by the client's table
    record = read_booking({"Id": ("s", "b1"), "GPUIndices": ("au", [0, 2]),
                           "EndedBy": ("i", -1), "Reason": ("s", "")})
    assert calendar_message("started", record, "today 22:00", 1000) == (
        "Booking b1 has started", "gpu0, gpu2 are yours until today 22:00.", 1)
    assert calendar_message("ending", record, "today 22:00", 1000)[0] == (
        "Booking b1 ends at today 22:00")
    assert calendar_message("blackout", record, "", 1000)[0].endswith("maintenance window")
    assert calendar_message("created", record, "", 1000) is None
    assert calendar_message("ended", record, "", 1000) is None  # it expired: no news
    assert calendar_message("ended", {**record, "ended_by": 1000}, "", 1000) is None  # mine
    cancelled = calendar_message("ended", {**record, "ended_by": 0, "reason": "driver"}, "", 1000)
    assert cancelled == ("Booking b1 was cancelled by an administrator", "driver", 2)
    no_show = calendar_message("ended", {**record, "ended": "no-show", "reason": "no process "
                                         "of alice used its GPUs in its first 3600 s"}, "", 1000)
    assert no_show[0] == "Booking b1 was released: its GPUs were not used"
    assert no_show[1].startswith("no process of alice used its GPUs") and no_show[2] == 2


S = 1_000_000  # a second in microseconds
T0 = 1_796_115_600 * S  # 10:00


def _blackout(ref: str, start: int, end: int, reason: str = "driver update") -> dict:
    return {"id": ref, "start_usec": start, "end_usec": end, "reason": reason}


def _booking(ref: str, start: int, end: int, state: str = "scheduled") -> dict:
    return {"id": ref, "state": state, "start_usec": start, "end_usec": end}


def test_a_blackout_over_my_live_bookings_is_warned_once_lead_seconds_before_it_begins():
    coming = Blackouts(lead=300)
    over_mine = _blackout("x1", T0 + 1800 * S, T0 + 2700 * S)
    coming.update(
        [_blackout("x0", T0 + 4000 * S, T0 + 5000 * S),   # over none of my bookings
         _blackout("x2", T0 + 3600 * S, T0 + 3700 * S),   # over an ended one only
         over_mine],
        [_booking("b1", T0, T0 + 3600 * S, "active"), _booking("b2", T0 + 1000 * S, T0 + 2000 * S),
         _booking("b3", T0 + 3500 * S, T0 + 3800 * S, "ended")])
    assert coming.next_due() == T0 + 1500 * S
    assert coming.due(T0 + 1499 * S) == []
    assert coming.due(T0 + 1500 * S) == [(over_mine, ["b1", "b2"])]
    assert coming.due(T0 + 1600 * S) == [] and coming.next_due() is None  # once
    coming.update([over_mine], [_booking("b1", T0, T0 + 3600 * S, "active")])
    assert coming.next_due() is None  # read again: still warned


def test_a_blackout_learned_of_after_it_began_is_not_warned_and_one_gone_is_forgotten():
    coming = Blackouts(lead=300)
    mine = [_booking("b1", T0, T0 + 3600 * S)]
    coming.update([_blackout("x1", T0, T0 + 60 * S)], mine)
    assert coming.due(T0 + 10 * S) == [] and coming.next_due() is None
    coming.update([_blackout("x2", T0 + 600 * S, T0 + 900 * S)], mine)
    coming.update([], mine)  # removed before its warning
    assert coming.next_due() is None and coming.due(T0 + 500 * S) == []


def test_a_blackout_warning_names_its_times_reason_and_my_bookings():
    x = _blackout("x1", T0, T0 + S)
    assert blackout_message(x, ["b1"], "today 10:30", "today 10:45") == (
        "Maintenance begins at today 10:30",
        "driver update, until today 10:45. Booking b1 falls in it: save your work.", 1)
    assert blackout_message({**x, "reason": ""}, ["b1", "b2"], "a", "b")[1] == (
        "Maintenance, until b. Bookings b1, b2 fall in it: save your work.")


def test_no_summary_repeats_the_application_name():
    """The server shows the app name ("resourced") already; a summary is a sentence."""
    for label in ("disk /data", "ram", "scratch"):
        for level in (WARN, STOP, ERROR):
            summary, _ = plain_words(label, level, "free 1G <= stop_free_gib 2")
            assert "resourced" not in summary.lower() and ":" not in summary, summary


# -- actions: only where the server has them -------------------------------------------

def test_bubbles_get_an_action_only_where_the_server_supports_actions():
    b = Bubbles()
    assert b.level_changed("data", STOP, "full").actions == ()
    assert b.message("Booking b1 has started", "x", 1, BOOKINGS).actions == ()
    b.actions_supported = True
    assert b.level_changed("data", STOP, "full").actions == ("default", "Show details")
    booking = b.message("Booking b1 has started", "x", 1, BOOKINGS)
    assert (booking.actions, booking.opens) == (("default", "Show bookings"), BOOKINGS)
    assert b.message("Notice from the administrators", "x", 1).actions == ()


def test_an_invoked_bubble_of_ours_opens_what_it_offers():
    b = Bubbles()
    shown(b, b.level_changed("quiet", WARN, "x"), 1)   # shown before the server had actions
    b.actions_supported = True
    shown(b, b.level_changed("data", STOP, "full"), 7)
    b.message_shown(b.message("Booking b1 has started", "x", 1, BOOKINGS), 8)
    b.message_shown(b.message("Notice", "x", 1), 9)
    assert b.invoked(7, "default") == RESOURCES
    assert b.invoked(8, "default") == BOOKINGS
    assert b.invoked(7, "another-key") is None
    for not_ours in (1, 9, 99):
        assert b.invoked(not_ours, "default") is None
    # a server may say NotificationClosed before ActionInvoked
    b.closed(7)
    assert b.invoked(7, "default") == RESOURCES
    # the ids of a server that went away mean nothing
    b.forget_all()
    assert b.invoked(7, "default") is None and b.invoked(8, "default") is None


def test_only_the_newest_ids_are_remembered():
    b = Bubbles()
    b.actions_supported = True
    for nid in range(1, OPENS_KEPT + 11):
        b.message_shown(b.message("Booking", "x", 1, BOOKINGS), nid)
    assert b.invoked(10, "default") is None
    assert b.invoked(11, "default") == b.invoked(OPENS_KEPT + 10, "default") == BOOKINGS


# -- which terminal, which gpuctl ------------------------------------------------------

def which_of(*found: str):
    """A ``which`` that finds ``found`` (names or paths), as /bin/NAME for names."""
    def which(name):
        if name not in found:
            return None
        return name if "/" in name else f"/bin/{name}"
    return which


def test_the_terminal_is_terminal_else_x_terminal_emulator_else_none():
    cmd = ["gpuctl", "resources"]
    both = which_of("kitty", "x-terminal-emulator")
    assert terminal_command(cmd, {"TERMINAL": "kitty"}, both) == ["/bin/kitty", "-e", *cmd]
    assert terminal_command(cmd, {"TERMINAL": "kitty --single-instance"}, both) == [
        "/bin/kitty", "--single-instance", "-e", *cmd]
    assert terminal_command(cmd, {}, both) == ["/bin/x-terminal-emulator", "-e", *cmd]
    for missing in ({"TERMINAL": "nonesuch"}, {"TERMINAL": ""}, {"TERMINAL": "'unbalanced"}):
        assert terminal_command(cmd, missing, both)[0] == "/bin/x-terminal-emulator"
    assert terminal_command(cmd, {"TERMINAL": "kitty"}, which_of()) is None
    assert terminal_command(cmd, {}, which_of("kitty")) is None


def test_gpuctl_is_the_one_beside_python_else_on_path_else_python_m():
    python = "/venv/bin/python"
    beside = gpuctl_command(["resources"], which_of("/venv/bin/gpuctl", "gpuctl"), python)
    on_path = gpuctl_command(["resources"], which_of("gpuctl"), python)
    neither = gpuctl_command(["resources"], which_of(), python)
    assert beside[-2:] == ["/venv/bin/gpuctl", "resources"]
    assert on_path[-2:] == ["/bin/gpuctl", "resources"]
    assert neither[-4:] == [python, "-m", "resourced.cli", "resources"]
    # held open by sh until Enter, the command passed as arguments (no quoting to get wrong)
    assert neither[:2] == ["sh", "-c"] and neither[3] == "sh"


def test_the_launcher_spawns_once_per_invoke_and_tells_once_when_there_is_no_terminal(caplog):
    spawned = []
    env = {"TERMINAL": "xterm", "PATH": "/bin"}
    launcher = Launcher(env, which_of("xterm", "gpuctl"),
                        lambda argv, env: spawned.append((argv, env)), python="/py/python")
    assert launcher.open(["resources", "--bus", "session"], {"XDG_ACTIVATION_TOKEN": "t"})
    (argv, spawn_env), = spawned
    assert argv[:2] == ["/bin/xterm", "-e"]
    assert " ".join(argv).endswith("/bin/gpuctl resources --bus session")
    assert spawn_env == {**env, "XDG_ACTIVATION_TOKEN": "t"}

    none = Launcher({}, which_of("gpuctl"), lambda argv, env: spawned.append(argv))
    with caplog.at_level("INFO", logger="resourced.notify"):
        assert not none.open(["resources"])
        assert not none.open(["resources"])
    assert [r.getMessage() for r in caplog.records].count(
        "cannot open gpuctl resources: no terminal (set $TERMINAL, or install "
        "x-terminal-emulator)") == 1
    assert len(spawned) == 1


def test_a_launch_that_fails_is_logged_not_raised(caplog):
    def spawn(argv, env):
        raise PermissionError(13, "Permission denied", argv[0])
    launcher = Launcher({"TERMINAL": "xterm"}, which_of("xterm"), spawn)
    with caplog.at_level("WARNING", logger="resourced.notify"):
        assert launcher.open(["bookings"]) is False
    assert "cannot open gpuctl bookings in /bin/xterm" in caplog.text


def test_spawn_detached_returns_at_once_in_a_new_session_and_leaves_no_zombie(tmp_path):
    import time

    done, go = tmp_path / "done", tmp_path / "go"
    started = time.monotonic()
    script = 'i=0; while [ ! -e "$1" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done'
    proc = spawn_detached(["sh", "-c", f'{script}; echo "$$" > "$0"', str(done), str(go)],
                          dict(os.environ))
    assert time.monotonic() - started < 30        # not held for the child's minute
    assert proc.returncode is None                 # the child runs on, unwaited for
    assert os.getsid(proc.pid) == proc.pid         # its own session: no signals of ours
    go.touch()
    deadline = time.monotonic() + 10
    while not (proc.returncode is not None and not Path(f"/proc/{proc.pid}").exists()):
        assert time.monotonic() < deadline, "the child was not reaped"
        time.sleep(0.02)
    assert done.read_text().strip() == str(proc.pid)
