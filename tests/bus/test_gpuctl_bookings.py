"""The calendar through gpuctl, as a user sees it: a real daemon on the private bus, on
simulated GPUs and a simulated clock, and gpuctl as a process.

The clock file holds *now* for the daemon, for gpuctl and for the clients of this process
(``RESOURCED_SIMULATED_CLOCK``, read only where ``RESOURCED_SIMULATED_GPUS`` is set too).
Time starts at 09:00 UTC on Tuesday 1 December 2026 and moves only when a test rewrites
the file; the daemon looks at it at least once a second, so every effect of moving it is
awaited with ``eventually`` (bounded).  gpuctl runs with ``TZ=UTC`` (unless a test says
otherwise), so what it shows as local time is UTC.
"""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from resourced.client.sync import Client
from resourced.protocol.records import BOOKING

from ..conftest import eventually, gpuctl
from .conftest import CLOCK_TIMEOUT, NOW, at

HOUR = 3600 * 1_000_000
REF = re.compile(r"^b[a-z0-9]+$")




# -- gpuctl -----------------------------------------------------------------------------
def ctl(*args: str, tz: str = "UTC") -> subprocess.CompletedProcess:
    return gpuctl(*args, env={"TZ": tz}, timeout=20)


def ok(*args: str, tz: str = "UTC") -> str:
    """gpuctl succeeds; its stdout."""
    r = ctl(*args, tz=tz)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def ok_json(*args: str):
    """gpuctl --json succeeds; what it printed, its keys checked to be sorted."""
    text = ok(*args, "--json")

    def sorted_keys(pairs):
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys), (args, keys)
        return dict(pairs)

    return json.loads(text, object_pairs_hook=sorted_keys)


def book(*args: str) -> str:
    """``gpuctl book``, which must succeed; the reference it printed."""
    ref = ok("book", *args).strip()
    assert REF.match(ref), ref
    return ref


def book_in(tz: str, *args: str) -> str:
    """``gpuctl book`` with local time in ``tz``; the reference."""
    ref = ok("book", *args, tz=tz).strip()
    assert REF.match(ref), ref
    return ref


def listed() -> list[dict]:
    """Everyone's bookings, as ``gpuctl bookings --all --json`` lists them."""
    return ok_json("bookings", "--all")


def by_ref(ref: str) -> dict:
    [found] = [b for b in listed() if b["id"] == ref]
    return found


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """Nothing on stdout, one ``gpuctl: ...`` line on stderr (no traceback); that line."""
    lines = r.stderr.splitlines()
    assert r.stdout == "" and len(lines) == 1 and lines[0].startswith("gpuctl: "), (
        r.stdout, r.stderr)
    return lines[0]


def refused(*args: str, code: int, match: str | None = None, tz: str = "UTC") -> str:
    """gpuctl exits ``code`` with one error line (containing ``match``) and every booking
    stays as it was; the line."""
    before = listed()
    r = ctl(*args, tz=tz)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    line = one_error_line(r)
    if match is not None:
        assert match in line, line
    assert listed() == before
    return line


def status() -> dict:
    with Client(timeout=5) as c:
        return c.status()


def claim_of(ref: str) -> dict | None:
    return next((c for c in status()["claims"] if c["id"] == ref), None)


@contextlib.contextmanager
def spawned(*args: str):
    """gpuctl as a process that runs on while the test goes on (killed if still running
    when the test leaves the block)."""
    proc = subprocess.Popen([sys.executable, "-m", "resourced.cli", *args],
                            env={**os.environ, "TZ": "UTC"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for ``proc`` (killed if it overruns, failing the test); code, stdout, stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=5)
        raise AssertionError(f"gpuctl still ran after {timeout}s:\n{out}\n{err}") from None
    return proc.returncode, out, err


def rows(table: str) -> list[list[str]]:
    """A table's lines, split on whitespace."""
    return [line.split() for line in table.splitlines()]


# -- book -------------------------------------------------------------------------------
def test_book_prints_the_reference_and_a_summary(clocked_daemon):
    clocked_daemon(gpus=4)
    r = ctl("book", "--gpus", "2", "--for", "2h", "--at", "10:00", "--label", "train")
    assert r.returncode == 0, r.stderr
    ref = r.stdout.strip()
    assert r.stdout == ref + "\n" and REF.match(ref)
    assert r.stderr.splitlines() == ["gpuctl: booked gpu0, gpu1, today 10:00 to today 12:00"]
    b = by_ref(ref)
    assert (b["state"], b["gpus_requested"], b["label"], b["start_usec"], b["end_usec"]) == (
        "scheduled", 2, "train", at("2026-12-01T10:00:00Z"), at("2026-12-01T12:00:00Z"))
    assert (b["start"], b["end"]) == ("2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z")


def test_book_json_says_created_queued_or_exists(clocked_daemon):
    clocked_daemon(gpus=2)
    created = ok_json("book", "--gpus", "2", "--for", "1h", "--at", "10:00", "--op-id", "job-42")
    assert set(created) == {"schema", "status", "booking"} and created["schema"] == 2
    assert created["status"] == "created"
    b = created["booking"]
    assert (b["start_usec"], b["end_usec"], b["op_id"]) == (
        at("2026-12-01T10:00:00Z"), at("2026-12-01T11:00:00Z"), "job-42")
    # Without --at, a start later than now (the earliest that fits) is "queued".
    queued = ok_json("book", "--gpus", "2", "--for", "2h")
    assert queued["status"] == "queued"
    assert queued["booking"]["start_usec"] == at("2026-12-01T11:00:00Z")
    # Without --at, one that starts now is "created" (and active).
    now = ok_json("book", "--gpus", "1", "--for", "1h")
    assert (now["status"], now["booking"]["start_usec"]) == ("created", at(NOW))
    assert now["booking"]["state"] == "active"
    # The same request with the same --op-id: the first booking, "exists".
    before = listed()
    again = ok_json("book", "--gpus", "2", "--for", "1h", "--at", "10:00", "--op-id", "job-42")
    assert again["status"] == "exists"
    assert again["booking"]["id"] == b["id"]
    assert listed() == before
    r = ctl("book", "--gpus", "2", "--for", "1h", "--at", "10:00", "--op-id", "job-42")
    assert r.returncode == 0 and r.stdout.strip() == b["id"]
    assert r.stderr.startswith("gpuctl: already booked (same --op-id): ")
    # Another request under that op id is refused.
    refused("book", "--gpus", "1", "--for", "1h", "--at", "10:00", "--op-id", "job-42",
            code=2, match="job-42")


def test_book_without_at_says_queued_on_stderr(clocked_daemon):
    clocked_daemon(gpus=1)
    book("--for", "1h")   # from now
    r = ctl("book", "--for", "30m")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("gpuctl: queued to start at the earliest fit: gpu0, "
                        "today 10:00 to today 10:30\n")


def test_book_json_gives_the_booking_iso_start_and_end(clocked_daemon):
    clocked_daemon(gpus=1)
    b = ok_json("book", "--for", "1h", "--at", "10:00")["booking"]
    assert (b.get("start"), b.get("end")) == ("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")


AT_FORMS = {
    "now": ("now", NOW),
    "+30m": ("+30m", "2026-12-01T09:30:00Z"),
    "+1d": ("+1d", "2026-12-02T09:00:00Z"),
    "clock later today": ("10:00", "2026-12-01T10:00:00Z"),
    "clock 11 h ahead: today": ("20:00", "2026-12-01T20:00:00Z"),
    "tomorrow": ("tomorrow 09:00", "2026-12-02T09:00:00Z"),
    "today": ("today 17:45", "2026-12-01T17:45:00Z"),
    "weekday": ("wed 09:00", "2026-12-02T09:00:00Z"),
    "weekday now: next week": ("tue 09:00", "2026-12-08T09:00:00Z"),
    "ISO Z": ("2026-12-01T15:00:00Z", "2026-12-01T15:00:00Z"),
    "ISO local": ("2026-12-03T15:00", "2026-12-03T15:00:00Z"),
    "ISO offset": ("2026-12-01T16:00:00+01:00", "2026-12-01T15:00:00Z"),
}


@pytest.mark.parametrize("when, start", AT_FORMS.values(), ids=AT_FORMS.keys())
def test_at_forms_start_where_they_say_on_the_simulated_clock(clocked_daemon, when, start):
    clocked_daemon(gpus=1)
    made = ok_json("book", "--for", "10m", "--at", when)
    assert made["status"] == "created"
    b = made["booking"]
    assert (b["start_usec"], b["end_usec"]) == (at(start), at(start) + HOUR // 6)
    assert b["state"] == ("active" if start == NOW else "scheduled")


def test_at_is_read_in_local_time_and_shown_in_it(clocked_daemon):
    clocked_daemon(gpus=1)
    # 09:00 UTC is 10:00 in Berlin.
    ref = book_in("Europe/Berlin", "--for", "1h", "--at", "11:00")
    assert by_ref(ref)["start_usec"] == at("2026-12-01T10:00:00Z")
    naive = book_in("Europe/Berlin", "--for", "1h", "--at", "2026-12-01T12:00")
    assert by_ref(naive)["start_usec"] == at("2026-12-01T11:00:00Z")
    table = ok("bookings", tz="Europe/Berlin")
    [row] = [r for r in rows(table) if r[0] == ref]
    assert row[3:7] == ["today", "11:00", "today", "12:00"]
    [row] = [r for r in rows(ok("bookings")) if r[0] == ref]   # the same in UTC
    assert row[3:7] == ["today", "10:00", "today", "11:00"]


BAD_BOOKS = {
    "a past --at": (["--at", "2026-12-01T08:00:00Z"], 2, "past"),
    "--for 0s": (["--for", "0s"], 2, "more than 0"),
    "--for soon": (["--for", "soon"], 2, "soon"),
    "longer than the longest booking": (["--for", "8d"], 2, "at most"),
    "beyond the horizon": (["--at", "2027-01-15T09:00:00Z"], 2, "ahead"),
    "more GPUs than exist": (["--gpus", "5"], 3, "5 GPU(s)"),  # as run and claim: exit 3
    "--gpus 0": (["--gpus", "0"], 2, "--gpus"),
    "an unknown GPU": (["--gpu", "9"], 2, "no GPU called '9'"),
    "a GPU wanted and excluded": (["--gpu", "1", "--exclude", "1"], 2, "wanted and excluded"),
    "--gpus with --gpu of another count": (["--gpus", "2", "--gpu", "1"], 2, "2 GPU(s) asked"),
    "a share on two named GPUs": (["--gpu", "1,2", "--vram", "10G"], 2, "goes on one GPU"),
    "an unparseable --at": (["--at", "soonish"], 2, "'soonish'"),
    "more VRAM than a GPU has": (["--vram", "81G"], 3, "80G"),
    "no --for": ([], 2, "--for"),
}


@pytest.mark.parametrize("args, code, match", BAD_BOOKS.values(), ids=BAD_BOOKS.keys())
def test_a_bad_book_exits_2_and_changes_nothing(clocked_daemon, args, code, match):
    clocked_daemon(gpus=4)
    book("--gpus", "1", "--for", "1h", "--at", "10:00")
    duration = [] if "--for" in args or not args else ["--for", "1h"]
    refused("book", *duration, *args, code=code, match=match)


def test_book_where_it_does_not_fit_exits_3_naming_the_nearest_start(clocked_daemon):
    clocked_daemon(gpus=4)
    book("--gpus", "4", "--for", "1h", "--at", "10:00")
    # 10:30 meets it; 11:00 (half an hour away) is nearer than 09:00 (an hour and a half).
    line = refused("book", "--gpus", "2", "--for", "1h", "--at", "10:30", code=3,
                   match="the nearest start that fits: today 11:00")  # local, as tables
    assert re.search(r" on gpu\d, gpu\d$", line), line
    # 30 minutes at 10:10: 09:30 (40 minutes before) is nearer than 11:00 (50 after).
    line = refused("book", "--gpus", "1", "--for", "30m", "--at", "+1h10m", code=3,
                   match="the nearest start that fits: today 09:30")
    assert re.search(r" on gpu\d$", line), line


def test_book_inside_a_blackout_exits_3_saying_so(clocked_daemon):
    clocked_daemon(gpus=2)
    ok("blackout", "add", "--from", "14:00", "--until", "16:00", "--reason", "driver update")
    line = refused("book", "--for", "1h", "--at", "14:30", code=3, match="blackout")
    assert re.search(r"the nearest start that fits: today 1[36]:00 on gpu\d$",
                     line), line
    refused("book", "--for", "2h", "--at", "13:00", code=3, match="blackout")
    assert book("--for", "1h", "--at", "13:00")   # ends as it begins
    assert by_ref(book("--for", "3h"))["start_usec"] == at("2026-12-01T09:00:00Z")
    late = ok_json("book", "--gpus", "2", "--for", "6h")["booking"]   # skips it
    assert late["start_usec"] == at("2026-12-01T16:00:00Z")


# -- bookings ---------------------------------------------------------------------------
def test_bookings_lists_a_table_by_start(clocked_daemon):
    clocked_daemon(gpus=2)
    assert ok("bookings") == "no bookings of yours (--all shows everyone's)\n"
    assert ok("bookings", "--all") == "no bookings\n"
    later = book("--gpus", "2", "--for", "1h", "--at", "12:00", "--label", "train")
    sooner = book("--gpu", "1", "--for", "30m", "--at", "10:00", "--task-name", "eval")
    gone = book("--for", "1h", "--at", "tomorrow 10:00")
    ok("cancel", gone)
    table = ok("bookings")
    assert ok("bookings", "--all") == table
    lines = table.splitlines()
    assert lines[0].split() == ["REF", "USER", "STATE", "FROM", "TO", "GPUS", "WANTS", "NOTE"]
    assert rows(table)[1:] == [
        [sooner, "root", "scheduled", "today", "10:00", "today", "10:30", "gpu1", "1",
         "GPU(s)", "eval"],
        [later, "root", "scheduled", "today", "12:00", "today", "13:00", "gpu0,gpu1", "2",
         "GPU(s)", "train"],
        [gone, "root", "ended", "tomorrow", "10:00", "tomorrow", "11:00", "gpu0", "1",
         "GPU(s)", "cancelled"],
    ]
    # Every column starts where its header does.
    for name in ("STATE", "FROM", "GPUS", "NOTE"):
        column = lines[0].index(name)
        assert all(line[column - 1] == " " and line[column] != " " for line in lines[1:]), name


def test_bookings_json_lists_records_with_sorted_keys(clocked_daemon):
    clocked_daemon(gpus=2)
    assert ok_json("bookings") == []
    second = book("--for", "1h", "--at", "11:00")
    first = book("--gpus", "2", "--for", "1h", "--at", "10:00", "--label", "x")
    found = ok_json("bookings")   # ok_json checks every object's keys are sorted
    assert [b["id"] for b in found] == [first, second]
    b = found[0]
    assert (b["start"], b["end"], b["start_usec"], b["end_usec"]) == (
        "2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z", at("2026-12-01T10:00:00Z"),
        at("2026-12-01T11:00:00Z"))
    assert (b["user"], b["uid"], b["state"], b["gpus_requested"], b["label"], b["gpu_indices"]) == (
        "root", 0, "scheduled", 2, "x", [0, 1])
    assert b["gpus"] == ["gpu0", "gpu1"]  # (aliases, as a claim's; schema 1 gave the count)
    assert set(b) == {f.key for f in BOOKING}
    with Client(timeout=5) as c:
        assert found == c.bookings()
        assert ok("bookings", "--json") == c.bookings_json() + "\n"   # the daemon's, unread


def test_bookings_table_shows_50_rows_then_says_there_are_more(clocked_daemon):
    clocked_daemon(gpus=1)
    refs = []
    with Client(timeout=5) as c:
        for i in range(55):
            refs.append(c.book("1h", gpus=1, start=at("2026-12-01T10:00:00Z") / 1e6 + i * 3600)
                        ["booking"]["id"])
            if i == 49:   # 50: all shown, nothing more to say
                lines = ok("bookings").splitlines()
                assert len(lines) == 51 and [r[0] for r in rows("\n".join(lines[1:]))] == refs
    lines = ok("bookings").splitlines()
    assert len(lines) == 52
    assert [line.split()[0] for line in lines[1:51]] == refs[:50]
    # The 51st starts 50 hours after 10:00 on Tuesday.
    assert lines[51] == "... and more after Thu 3 Dec 12:00 (--json lists them all)"
    assert ok("bookings", "--all").splitlines() == lines
    assert [b["id"] for b in ok_json("bookings")] == refs


def test_bookings_since_shows_what_ended_before_the_last_day(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    gone = book("--for", "1h", "--at", "10:00")
    ok("cancel", gone)                                   # ended at 09:00 on the 1st
    ahead = book("--for", "1h", "--at", "2026-12-02T12:00:00Z")
    assert [b["id"] for b in ok_json("bookings")] == [gone, ahead]   # ended in the last day
    clock.set("2026-12-02T10:00:00Z")                    # 25 hours later
    eventually(lambda: [b["id"] for b in ok_json("bookings")] == [ahead], CLOCK_TIMEOUT)
    assert gone not in ok("bookings") and gone not in ok("bookings", "--all")
    since = ["--since", "2026-12-01T08:00:00Z"]
    assert [b["id"] for b in ok_json("bookings", *since)] == [gone, ahead]
    [row] = [r for r in rows(ok("bookings", *since)) if r[0] == gone]
    assert row[2:] == ["ended", "yesterday", "10:00", "yesterday", "11:00", "gpu0", "1",
                       "GPU(s)", "cancelled"]
    assert [b["id"] for b in ok_json("bookings", "--all", *since)] == [gone, ahead]
    # It ended at 09:00 exactly: listed from then, not from a second later.
    assert [b["id"] for b in ok_json("bookings", "--since", "2026-12-01T09:00:00Z")] == [
        gone, ahead]
    assert [b["id"] for b in ok_json("bookings", "--since", "2026-12-01T09:00:01Z")] == [ahead]
    refused("bookings", "--since", "whenever", code=2, match="--since")


@pytest.mark.parametrize("since", ["yesterday", "yesterday 09:00"])
def test_bookings_since_yesterday_as_the_help_example_says(clocked_daemon, clock, since):
    clocked_daemon(gpus=1)
    gone = book("--for", "1h", "--at", "10:00")
    ok("cancel", gone)
    clock.set("2026-12-02T10:00:00Z")
    r = ctl("bookings", "--all", "--since", since, "--json")
    assert r.returncode == 0, r.stderr
    assert [b["id"] for b in json.loads(r.stdout)] == [gone]


# -- edit, extend, cancel ---------------------------------------------------------------
def test_edit_changes_what_it_is_given_and_keeps_the_rest(clocked_daemon):
    clocked_daemon(gpus=2)
    ref = book("--for", "1h", "--at", "10:00", "--label", "x")
    assert ok("edit", ref, "--at", "12:00") == f"{ref}: scheduled, gpu0, today 12:00 to today 13:00\n"
    b = ok_json("edit", ref, "--for", "2h")["booking"]
    assert (b["start_usec"], b["end_usec"], b["label"]) == (
        at("2026-12-01T12:00:00Z"), at("2026-12-01T14:00:00Z"), "x")
    assert (b["start"], b["end"]) == ("2026-12-01T12:00:00Z", "2026-12-01T14:00:00Z")
    b = ok_json("edit", ref, "--until", "14:30")["booking"]
    assert (b["start_usec"], b["end_usec"]) == (at("2026-12-01T12:00:00Z"),
                                                at("2026-12-01T14:30:00Z"))
    b = ok_json("edit", ref, "--at", "13:00", "--until", "14:00")["booking"]
    assert (b["start_usec"], b["end_usec"]) == (at("2026-12-01T13:00:00Z"),
                                                at("2026-12-01T14:00:00Z"))
    b = ok_json("edit", ref, "--label", "renamed", "--task-name", "llm")["booking"]
    assert (b["label"], b["task_name"], b["start_usec"]) == (
        "renamed", "llm", at("2026-12-01T13:00:00Z"))
    b = ok_json("edit", ref, "--gpus", "2")["booking"]
    assert (b["gpus"], b["gpus_requested"], b["gpu_indices"]) == (["gpu0", "gpu1"], 2, [0, 1])
    # --earliest: the earliest start that fits, the same length.
    book("--gpus", "2", "--for", "30m")   # from now
    b = ok_json("edit", ref, "--earliest")["booking"]
    assert (b["start_usec"], b["end_usec"], b["state"]) == (
        at("2026-12-01T09:30:00Z"), at("2026-12-01T10:30:00Z"), "scheduled")
    assert by_ref(ref) == b   # the listed record


BAD_EDITS = {
    "nothing to change": ([], 2, "nothing to change"),
    "--for with --until": (["--for", "1h", "--until", "12:00"], 2, "not both"),
    "--at with --earliest": (["--at", "11:00", "--earliest"], 2, "not both"),
    "--until before the start": (["--until", "09:30"], 2, "after the start"),
    "a past --at": (["--at", "2026-12-01T08:00:00Z"], 2, "past"),
    "more GPUs than exist": (["--gpus", "3"], 3, "3 GPU(s)"),
    "--for 0s": (["--for", "0s"], 2, "more than 0"),
    "an unparseable --at": (["--at", "soonish"], 2, "'soonish'"),
    "onto another booking": (["--at", "11:30"], 3, "the nearest start that fits"),
    "longer into another booking": (["--for", "3h"], 3, None),
}


@pytest.mark.parametrize("args, code, match", BAD_EDITS.values(), ids=BAD_EDITS.keys())
def test_a_bad_edit_is_refused_and_changes_nothing(clocked_daemon, args, code, match):
    clocked_daemon(gpus=2)
    ref = book("--for", "1h", "--at", "10:00")
    book("--gpus", "2", "--for", "1h", "--at", "12:00")
    refused("edit", ref, *args, code=code, match=match)


def test_edit_of_an_unknown_or_started_booking_is_refused(clocked_daemon):
    clocked_daemon(gpus=2)
    refused("edit", "bnothere", "--for", "1h", code=6, match="bnothere")
    now = book("--for", "1h")   # started: only its end may change
    refused("edit", now, "--label", "late", code=2, match="started")
    refused("edit", now, "--until", "2026-12-01T09:30:00Z", code=2, match="started")


def test_edit_earliest_with_until_ends_where_until_says_or_is_refused(clocked_daemon):
    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "11:00")
    r = ctl("edit", ref, "--earliest", "--until", "12:30", "--json")
    if r.returncode != 2:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["booking"]["end_usec"] == at("2026-12-01T12:30:00Z"), r.stdout


def test_extend_moves_the_end_later_or_earlier(clocked_daemon):
    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "10:00")
    later = book("--for", "1h", "--at", "12:00")
    assert ok("extend", ref, "--by", "30m") == f"{ref}: scheduled, gpu0, today 10:00 to today 11:30\n"
    b = ok_json("extend", ref, "--until", "12:00")["booking"]   # back to back with the next
    assert (b["end_usec"], b["end"]) == (at("2026-12-01T12:00:00Z"), "2026-12-01T12:00:00Z")
    refused("extend", ref, "--by", "1m", code=3)
    b = ok_json("extend", ref, "--until", "10:45")["booking"]   # shrunk
    assert (b["start_usec"], b["end_usec"]) == (at("2026-12-01T10:00:00Z"),
                                                at("2026-12-01T10:45:00Z"))
    refused("extend", ref, code=2, match="exactly one")
    refused("extend", ref, "--by", "1h", "--until", "13:00", code=2, match="exactly one")
    refused("extend", ref, "--until", "2026-12-01T09:30:00Z", code=2)
    refused("extend", ref, "--by", "8d", code=2)
    refused("extend", "bnothere", "--by", "1h", code=6, match="bnothere")
    assert by_ref(later)["end_usec"] == at("2026-12-01T13:00:00Z")


def test_extend_an_active_booking_but_not_back_before_now(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "10:00")
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: by_ref(ref)["state"] == "active", CLOCK_TIMEOUT)
    b = ok_json("extend", ref, "--by", "15m")["booking"]
    assert (b["state"], b["end_usec"]) == ("active", at("2026-12-01T11:15:00Z"))
    assert claim_of(ref)["until_usec"] == b["end_usec"]
    assert ok("extend", ref, "--until", "+30m") == \
        f"{ref}: active, gpu0, today 10:00 to today 10:30\n"
    assert claim_of(ref)["until_usec"] == at("2026-12-01T10:30:00Z")
    refused("extend", ref, "--until", "2026-12-01T10:00:00Z", code=2)
    refused("extend", ref, "--until", "now", code=2)
    # The released tail is free at once.
    assert by_ref(book("--for", "30m", "--at", "10:30"))["start_usec"] == at(
        "2026-12-01T10:30:00Z")


def test_cancel_ends_a_booking_once(clocked_daemon, clock):
    clocked_daemon(gpus=2)
    ref = book("--for", "1h", "--at", "10:00")
    assert ok("cancel", ref) == f"{ref}: cancelled, gpu0, today 10:00 to today 11:00\n"
    b = by_ref(ref)
    assert (b["state"], b["ended"]) == ("ended", "cancelled")
    refused("cancel", "bnothere", code=6, match="bnothere")
    # JSON, and an --op-id replay answers the same.
    other = book("--for", "1h", "--at", "10:00")
    gone = ok_json("cancel", other, "--op-id", "c-1")["booking"]
    assert (gone["id"], gone["state"], gone["ended"]) == (other, "ended", "cancelled")
    assert ok_json("cancel", other, "--op-id", "c-1")["booking"] == gone
    # An active one gives its GPUs back at once: "released".
    active = book("--gpus", "2", "--for", "1h")
    eventually(lambda: (claim_of(active) or {}).get("state") == "granted", CLOCK_TIMEOUT)
    clock.set("2026-12-01T09:20:00Z")
    assert ok("cancel", active) == f"{active}: released, gpu0, gpu1, today 09:00 to today 09:20\n"
    assert claim_of(active) is None
    assert {g["state"] for g in status()["gpus"]} == {"free"}
    again = ctl("cancel", ref)  # its owner's retry, later: it happened, and is said so
    assert again.returncode == 0 and "cancelled already, today 09:00" in again.stderr


# -- slots ------------------------------------------------------------------------------
def slot_commands(text: str) -> list[tuple[str, list[str]]]:
    """Each line of ``gpuctl slots``: where it says, and the command it prints."""
    out = []
    for line in text.splitlines():
        where, command = line.split(":  ", 1)
        out.append((where, shlex.split(command)))
    return out


def test_slots_print_commands_that_book_exactly_there(clocked_daemon):
    clocked_daemon(gpus=2)
    book("--gpus", "2", "--for", "1h", "--at", "09:30")
    book("--gpu", "0", "--for", "1h", "--at", "11:00")
    before = listed()
    text = ok("slots", "--gpus", "1", "--for", "1h", "--label", "two words", "--after", "09:10",
              "--count", "2")
    assert listed() == before   # books nothing
    found = slot_commands(text)
    # From 09:10 an hour meets 09:30; from 10:30 gpu0 has half an hour, gpu1 all it wants.
    # The next place is sought from the next end after that start: 12:00.
    assert [where for where, _ in found] == ["today 10:30 to today 11:30 on gpu1",
                                             "today 12:00 to today 13:00 on gpu0"]
    for _, command in found:
        assert command[:2] == ["gpuctl", "book"]
        assert "--after" not in command and "--count" not in command
        assert command[2:8] == ["--gpus", "1", "--for", "1h", "--label", "two words"]
        assert command[-2] == "--at"
    assert [command[-1] for _, command in found] == ["2026-12-01T10:30:00Z",
                                                     "2026-12-01T12:00:00Z"]
    for where, command in found:
        made = ok_json(*command[1:])
        assert made["status"] == "created"
        b = made["booking"]
        assert b["start_usec"] == at(command[-1])
        assert b["label"] == "two words"
        assert where.endswith(" on " + ", ".join(f"gpu{i}" for i in b["gpu_indices"]))


def test_slots_json_and_nowhere(clocked_daemon, owner):
    clocked_daemon(gpus=2)
    book("--gpu", "0", "--for", "1h")   # from now
    found = ok_json("slots", "--gpus", "2", "--for", "2h")
    assert len(found) == 1   # from 10:00 nothing ends: one place
    [first] = found
    assert (first["start"], first["end"], first["start_usec"], first["end_usec"]) == (
        "2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z", at("2026-12-01T10:00:00Z"),
        at("2026-12-01T12:00:00Z"))
    assert first["gpu_indices"] == [0, 1] and len(first["gpu_uuids"]) == 2
    one = ok_json("slots", "--for", "1h")   # now on gpu1, then from 10:00
    assert [(s["start_usec"], s["gpu_indices"]) for s in one] == [
        (at(NOW), [1]), (at("2026-12-01T10:00:00Z"), [0])]
    assert len(ok_json("slots", "--for", "1h", "--count", "1")) == 1
    # An open-ended claim on the other GPU: two GPUs fit nowhere.
    ok("claim", "--gpus", "1", "--owner-pid", str(owner.pid))
    assert ok("slots", "--gpus", "2", "--for", "1h") == \
        "it fits nowhere within the booking horizon\n"
    assert ok_json("slots", "--gpus", "2", "--for", "1h") == []
    refused("slots", "--for", "1h", "--count", "0", code=2, match="--count")
    refused("slots", "--for", "1h", "--gpu", "9", code=2, match="no GPU called '9'")
    refused("slots", "--for", "0s", code=2, match="more than 0")


IMPOSSIBLE_SLOTS = {
    "more GPUs than exist": ["--gpus", "3", "--for", "1h"],
    "more VRAM than a GPU has": ["--vram", "81G", "--for", "1h"],
    "longer than the longest booking": ["--for", "8d"],
    "beyond the horizon": ["--for", "1h", "--after", "2027-02-01T00:00:00Z"],
}


@pytest.mark.parametrize("args", IMPOSSIBLE_SLOTS.values(), ids=IMPOSSIBLE_SLOTS.keys())
def test_slots_refuse_what_book_refuses_and_print_only_commands_book_takes(clocked_daemon,
                                                                           args):
    clocked_daemon(gpus=2)
    r = ctl("slots", *args)
    if r.returncode in (2, 3):  # what can never fit: 3 for more than there is, as book
        one_error_line(r)
        return
    assert r.returncode == 0 and "fits nowhere" not in r.stdout, r.stdout
    for _, command in slot_commands(r.stdout):
        made = ctl(*command[1:])
        assert made.returncode == 0, (command, made.stderr)


def test_slots_commands_book_there_when_now_is_not_a_whole_second(clocked_daemon, clock):
    clock.set("2026-12-01T09:00:00.5Z")
    clocked_daemon(gpus=1)
    book("--for", "10m")                                   # 09:00:00.5 to 09:10:00.5
    text = ok("slots", "--for", "10m", "--count", "2")
    for _, command in slot_commands(text):
        r = ctl(*command[1:])
        assert r.returncode == 0, (command, r.stderr)


def test_the_nearest_start_named_fits_when_now_is_not_a_whole_second(clocked_daemon, clock):
    clock.set("2026-12-01T09:00:00.5Z")
    clocked_daemon(gpus=1)
    book("--for", "10m")                                   # 09:00:00.5 to 09:10:00.5
    line = refused("book", "--for", "10m", "--at", "+5m", code=3)
    nearest = re.search(r"the nearest start that fits: (.+?) on ", line)[1]
    r = ctl("book", "--for", "10m", "--at", nearest)
    assert r.returncode == 0, (nearest, r.stderr)


# -- blackouts and notices --------------------------------------------------------------
def test_blackout_add_list_remove(clocked_daemon):
    clocked_daemon(gpus=2)
    inside = book("--for", "30m", "--at", "14:30")
    r = ctl("blackout", "add", "--from", "14:00", "--until", "16:00", "--reason", "driver update")
    assert r.returncode == 0, r.stderr
    blackout = r.stdout.strip()
    assert r.stdout == blackout + "\n" and blackout
    assert r.stderr == f"gpuctl: bookings already in it (kept, owners told): {inside}\n"
    assert by_ref(inside)["state"] == "scheduled"
    table = ok("blackout", "list")
    assert table.splitlines()[0].split() == ["ID", "FROM", "TO", "REASON"]
    assert rows(table)[1:] == [[blackout, "today", "14:00", "today", "16:00", "driver",
                                "update"]]
    [listed_json] = ok_json("blackout", "list")
    assert (listed_json["id"], listed_json["start"], listed_json["end"],
            listed_json["reason"]) == (blackout, "2026-12-01T14:00:00Z", "2026-12-01T16:00:00Z",
                                       "driver update")
    refused("book", "--for", "30m", "--at", "15:00", code=3, match="blackout")
    other = ok_json("blackout", "add", "--from", "tomorrow 01:00", "--until", "tomorrow 02:00",
                    "--reason", "x")
    assert other["bookings_inside"] == [] and other["id"] != blackout and other["schema"] == 2
    refused("blackout", "add", "--from", "16:00", "--until", "15:00", "--reason", "x", code=2,
            match="after --from")
    refused("blackout", "add", "--from", "2026-12-01T08:00:00Z", "--until",
            "2026-12-01T08:30:00Z", "--reason", "x", code=2, match="past")
    refused("blackout", "add", "--from", "16:00", "--until", "17:00", code=2, match="--reason")
    r = ctl("blackout", "remove", blackout)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert [b["id"] for b in ok_json("blackout", "list")] == [other["id"]]
    ok("blackout", "remove", other["id"])
    assert ok("blackout", "list") == "no blackouts\n"
    assert ok_json("blackout", "list") == []
    refused("blackout", "remove", blackout, code=6)
    assert book("--for", "30m", "--at", "15:00")


def test_notice_add_list_remove_and_status(clocked_daemon, clock):
    clocked_daemon(gpus=2)
    lasting = ok("notice", "add", "gpu1 is replaced on Friday").strip()
    brief = ok_json("notice", "add", "reboot at 10:00", "--until", "10:00")["id"]
    assert lasting and brief and lasting != brief
    table = ok("notice", "list")
    assert table.splitlines()[0].split() == ["ID", "UNTIL", "TEXT"]
    assert rows(table)[1:] == [
        [lasting, "removed", "gpu1", "is", "replaced", "on", "Friday"],
        [brief, "today", "10:00", "reboot", "at", "10:00"],
    ]
    assert [n["id"] for n in ok_json("notice", "list")] == [lasting, brief]
    book("--for", "1h", "--at", "12:00")
    book("--gpus", "2", "--for", "1h", "--at", "13:00")
    shown = ok("status").splitlines()
    assert "NOTICE: gpu1 is replaced on Friday" in shown
    assert "NOTICE: reboot at 10:00" in shown
    assert any(line.startswith("2 booking(s) ahead") for line in shown), shown
    # Past its --until it goes.
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: "NOTICE: reboot at 10:00" not in ok("status"), CLOCK_TIMEOUT)
    assert [n["id"] for n in ok_json("notice", "list")] == [lasting]
    r = ctl("notice", "remove", lasting)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert "NOTICE" not in ok("status")
    assert ok("notice", "list") == "no notices\n"
    refused("notice", "remove", lasting, code=6)
    refused("notice", "add", "   ", code=2)


# -- timeline ---------------------------------------------------------------------------
def test_timeline_draws_each_gpu_and_places_a_booking(clocked_daemon, owner):
    clocked_daemon(gpus=4)
    ref = book("--gpu", "1", "--for", "1h", "--at", "10:00")
    text = ok("timeline", "--hours", "4", "--width", "80")
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    assert lines[0].split() == ["09:00", "10:00", "11:00", "12:00"]
    assert lines[1].startswith("now   |")
    # 74 cells of 4 h: 10:00 falls in cell 18, 11:00 at the start of cell 37.
    assert lines[2:6] == [
        "gpu0  " + "." * 74,
        "gpu1  " + "." * 18 + "A" * 19 + "." * 37,
        "gpu2  " + "." * 74,
        "gpu3  " + "." * 74,
    ]
    assert lines[6:] == ["", f"A  {ref}  root  booking  today 10:00-11:00"]
    # A claim for 30 minutes, from now: before the booking in the letters.
    ok("claim", "--gpus", "1", "--for", "30m", "--owner-pid", str(owner.pid))
    lines = ok("timeline", "--hours", "4", "--width", "80").splitlines()
    [claimed] = [g["index"] for g in status()["gpus"] if g["state"] == "claimed"]
    assert claimed != 1
    assert lines[2 + claimed] == f"gpu{claimed}  " + "A" * 10 + "." * 64
    assert lines[3] == "gpu1  " + "." * 18 + "B" * 19 + "." * 37
    assert lines[7].startswith("A  c") and lines[7].endswith("root  claim    today 09:00-09:30")
    assert lines[8] == f"B  {ref}  root  booking  today 10:00-11:00"
    assert all(len(line) <= 80 for line in lines)


def test_timeline_json(clocked_daemon):
    clocked_daemon(gpus=2)
    ref = book("--gpu", "1", "--for", "1h", "--at", "10:00")
    book("--for", "1h", "--at", "14:00")   # beyond 4 h
    data = ok_json("timeline", "--hours", "4")
    assert (data["schema"], data["now_usec"], data["until_usec"]) == (2, at(NOW),
                                                                      at(NOW) + 4 * HOUR)
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    uuid1 = data["gpus"][1]["uuid"]
    assert data["entries"] == [{
        "id": ref, "user": "root", "gpus": ["gpu1"], "gpu_uuids": [uuid1], "kind": "booking",
        "shared": False,
        "start_usec": at("2026-12-01T10:00:00Z"), "end_usec": at("2026-12-01T11:00:00Z"),
    }]
    refused("timeline", "--width", "20", code=2)


# -- claims and runs on the calendar ----------------------------------------------------
def test_claim_for_is_warned_when_granted_only_until_a_booking(clocked_daemon, owner):
    clocked_daemon(gpus=2)
    booked = book("--gpus", "2", "--for", "1h", "--at", "09:15")
    r = ctl("claim", "--gpus", "1", "--for", "30m", "--owner-pid", str(owner.pid))
    assert r.returncode == 0, r.stderr
    ref = r.stdout.strip()
    [warning] = r.stderr.splitlines()
    assert warning.startswith("gpuctl: warning: granted until today 09:15"), warning
    cl = claim_of(ref)
    assert (cl["until_usec"], cl["until_booking"]) == (at("2026-12-01T09:15:00Z"), booked)


def test_claim_for_ending_before_a_booking_is_not_warned(clocked_daemon, owner):
    clocked_daemon(gpus=2)
    book("--gpus", "2", "--for", "1h", "--at", "10:00")
    r = ctl("claim", "--gpus", "1", "--for", "30m", "--owner-pid", str(owner.pid))
    assert (r.returncode, r.stderr) == (0, "")
    cl = claim_of(r.stdout.strip())
    assert (cl["until_usec"], cl["until_booking"]) == (at("2026-12-01T09:30:00Z"), "")
    # An open-ended claim on the other GPU, booked from 10:00: granted until then, warned.
    r = ctl("claim", "--gpus", "1", "--owner-pid", str(owner.pid))
    assert r.returncode == 0 and "granted until today 10:00" in r.stderr, r.stderr


def test_run_for_is_stopped_at_its_end_on_the_simulated_clock(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    with spawned("run", "--for", "2s", "--", "sleep", "30") as proc:
        held = eventually(lambda: next((c for c in status()["claims"] if c["mode"] == "run"),
                                       None), 10)
        assert held["until_usec"] == at(NOW) + 2_000_000
        # The real clock moves on, the simulated one does not: it runs on.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.5)
        clock.set("2026-12-01T09:00:03Z")
        code, _, err = finish(proc, 6)
    assert code == 128 + signal.SIGTERM, err
    eventually(lambda: status()["claims"] == [], CLOCK_TIMEOUT)


def test_run_on_an_active_booking_gets_its_reference(clocked_daemon):
    clocked_daemon(gpus=2)
    ref = book("--gpus", "2", "--for", "1h")
    eventually(lambda: (claim_of(ref) or {}).get("state") == "granted", CLOCK_TIMEOUT)
    uuids = ",".join(by_ref(ref)["gpu_uuids"])
    r = ctl("run", "--allocation", ref, "--", "sh", "-c",
            'printf "%s\\n" "$RESOURCED_ALLOCATION" "$CUDA_VISIBLE_DEVICES"; exit 7')
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == [ref, uuids]
    assert by_ref(ref)["state"] == "active"   # the booking stays
    assert claim_of(ref)["state"] == "granted"
    assert ok_json("env", "--allocation", ref)["RESOURCED_ALLOCATION"] == ref


def test_run_on_a_booking_not_started_exits_6_without_running(clocked_daemon, tmp_path):
    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "10:00")
    marker = tmp_path / "ran"
    r = ctl("run", "--allocation", ref, "--", "touch", str(marker))
    assert r.returncode == 6
    one_error_line(r)
    assert not marker.exists()


def test_run_on_a_booking_is_stopped_at_the_booking_end(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    ref = book("--for", "10m")
    eventually(lambda: (claim_of(ref) or {}).get("state") == "granted", CLOCK_TIMEOUT)
    with spawned("run", "--allocation", ref, "--", "sleep", "30") as proc:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.5)
        clock.set("2026-12-01T09:10:00Z")
        code, _, err = finish(proc, 6)
    assert code == 128 + signal.SIGTERM, err
    eventually(lambda: by_ref(ref)["ended"] == "expired", CLOCK_TIMEOUT)


# -- help -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[group, sub] for group in ("blackout", "notice")
                                  for sub in ("add", "list", "remove")])
def test_every_calendar_subcommand_help_ends_with_an_example(argv):
    r = gpuctl(*argv, "--help")
    assert (r.returncode, r.stderr) == (0, ""), argv
    description = r.stdout.split("\nOptions:\n", 1)[0].rstrip()
    assert description.split("\n\n")[-1].strip().startswith("Example: gpuctl " + " ".join(argv)), \
        r.stdout


def test_dry_run_says_what_would_happen_and_changes_nothing(clocked_daemon):
    clocked_daemon(gpus=2)
    ref = ok("book", "--gpus", "1", "--for", "1h", "--at", "10:00").strip()
    before = ok_json("bookings", "--all", "--json")
    dry = ctl("book", "--gpus", "2", "--for", "1h", "--at", "12:00", "--dry-run")
    assert dry.returncode == 0 and dry.stdout == "" and "would book" in dry.stderr
    dry_json = ok_json("book", "--gpus", "1", "--for", "1h", "--dry-run", "--json")
    assert (dry_json["status"], dry_json["booking"]["id"]) == ("dry-run", "")  # no reference
    assert "would be" in ok("extend", ref, "--by", "1h", "--dry-run")
    assert ok_json("cancel", ref, "--dry-run", "--json")["status"] == "dry-run"
    # Every calendar write says its schema, as status does.
    for write in (("book", "--gpus", "1", "--for", "1h", "--at", "15:00"),
                  ("edit", ref, "--at", "10:30"), ("extend", ref, "--by", "30m"),
                  ("cancel", ref)):
        assert ok_json(*write, "--dry-run")["schema"] == 2, write
    refused("book", "--gpus", "2", "--for", "1h", "--at", "10:30", "--dry-run", code=3,
            match="nearest start")
    assert ok_json("bookings", "--all", "--json") == before


def test_a_cancelled_bookings_note_names_who_cancelled_it_by_name(clocked_daemon):
    """The table's note said 'cancelled by uid 0: ...'; everywhere else a person is named."""
    import pwd

    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "10:00")
    ok("cancel", ref, "--reason", "plans changed")
    [row] = [line for line in ok("bookings", "--since", "1h").splitlines() if ref in line]
    me = pwd.getpwuid(os.getuid()).pw_name
    assert row.endswith(f"cancelled by {me}: plans changed"), row


def test_a_refused_extend_names_what_holds_the_gpus_and_the_latest_end_that_fits(
        clocked_daemon):
    """It said only 'its GPUs or amounts are booked then': neither who, nor until when."""
    import pwd

    clocked_daemon(gpus=1)
    ref = book("--for", "1h", "--at", "10:00")
    later = book("--for", "1h", "--at", "12:00")
    me = pwd.getpwuid(os.getuid()).pw_name
    said = refused("extend", ref, "--until", "14:00", code=3)
    assert (f"{me}'s booking {later} holds gpu0 from today 12:00; the latest end that fits "
            "is today 12:00") in said, said
    back_to_back = ok_json("extend", ref, "--until", "today 12:00")["booking"]  # as said
    assert back_to_back["end"] == "2026-12-01T12:00:00Z"
    said = refused("extend", ref, "--by", "1m", code=3)
    assert f"{me}'s booking {later} holds gpu0 from its end on" in said, said


def test_a_booking_that_starts_at_once_is_said_booked_not_queued(start_daemon):
    """On the wall clock, asked for now, it starts at the next whole second, and was
    reported as 'queued to start at the earliest fit'."""
    start_daemon(gpus="1")
    r = ctl("book", "--for", "1h")
    assert r.returncode == 0 and r.stderr.startswith("gpuctl: booked gpu0, "), r.stderr
