"""core.health: inclusive limits, the highest level wins, the worst check is the machine's
health, and exactly one event per level change."""

import json
import subprocess
import sys

import pytest

from resourced.config import CheckEntry
from resourced.core.health import (
    ERROR,
    NOT_MEASURED,
    OK,
    STOP,
    UNAVAILABLE,
    WARN,
    HealthBook,
    LevelChanged,
    Measurement,
    level_for,
    limits_of,
    worst,
)

GIB = 1024**3


def disk(**limits) -> CheckEntry:
    return CheckEntry(name="data", type="disk", path="/data", **limits)


def m(free: int, total: int = 100 * GIB) -> Measurement:
    return Measurement(free, total)


# -- thresholds, at their exact values ----------------------------------------------------

@pytest.mark.parametrize("key, level", [("warn_free_gib", WARN), ("stop_free_gib", STOP)])
def test_free_gib_is_reached_at_the_limit_exactly(key, level):
    check = disk(**{key: 10})
    assert level_for(check, m(10 * GIB))[0] == level
    assert level_for(check, m(10 * GIB - 1))[0] == level
    assert level_for(check, m(10 * GIB + 1))[0] == OK


def test_fractional_gib_limit_is_exact():
    check = disk(stop_free_gib=9.5)
    assert level_for(check, m(9 * GIB + GIB // 2))[0] == STOP
    assert level_for(check, m(9 * GIB + GIB // 2 + 1))[0] == OK


@pytest.mark.parametrize("key, level", [("warn_free_pct", WARN), ("stop_free_pct", STOP)])
def test_free_pct_is_reached_at_the_limit_exactly(key, level):
    check = disk(**{key: 15})
    assert level_for(check, m(15, 100))[0] == level
    assert level_for(check, m(150, 1000))[0] == level
    assert level_for(check, m(151, 1000))[0] == OK
    # 3/20 = 15 % exactly, whatever the float arithmetic would make of it
    assert level_for(check, m(3 * GIB, 20 * GIB))[0] == level


@pytest.mark.parametrize("key, level", [("warn_used_pct", WARN), ("stop_used_pct", STOP)])
def test_used_pct_is_reached_at_the_limit_exactly(key, level):
    check = disk(**{key: 90})
    assert level_for(check, m(10, 100))[0] == level       # used 90 %
    assert level_for(check, m(9, 100))[0] == level        # used 91 %
    assert level_for(check, m(101, 1000))[0] == OK        # used 89.9 %


def test_a_decimal_limit_means_the_decimal_written():
    # float(99.9) is a hair above 99.9; 999 of 1000 used must still reach it.
    assert level_for(disk(stop_used_pct=99.9), m(1, 1000))[0] == STOP
    assert level_for(disk(stop_free_pct=0.1), m(1, 1000))[0] == STOP


def test_no_limits_is_ok():
    assert level_for(disk(), m(0))[0] == OK


def test_the_highest_level_reached_wins_and_is_named():
    check = disk(warn_free_gib=20, stop_free_gib=10, warn_used_pct=50)
    assert level_for(check, m(30 * GIB)) [0] == WARN           # used 70 %
    level, reason = level_for(check, m(int(9.5 * GIB)))
    assert level == STOP
    assert reason == "free 9.5G <= stop_free_gib 10"
    level, reason = level_for(check, m(15 * GIB))
    assert (level, reason) == (WARN, "free 15G <= warn_free_gib 20")


def test_reasons_name_the_limit_for_each_kind():
    assert level_for(disk(warn_free_pct=15), m(12, 100))[1] == "free 12.0% <= warn_free_pct 15"
    assert level_for(disk(stop_used_pct=90), m(5, 100))[1] == "used 95.0% >= stop_used_pct 90"
    level, reason = level_for(disk(stop_free_gib=1), m(50 * GIB))
    assert level == OK and "no limit reached" in reason


def test_measurement_rejects_nonsense():
    with pytest.raises(ValueError):
        Measurement(1, 0)
    with pytest.raises(ValueError):
        Measurement(-1, 10)


def test_limits_of_lists_only_the_set_limits_in_key_order():
    check = CheckEntry("ram", "ram", stop_free_pct=10, warn_free_pct=15)
    assert limits_of(check) == {"warn_free_pct": 15, "stop_free_pct": 10}


# -- the machine's health ---------------------------------------------------------------

def test_worst_orders_ok_warn_stop():
    assert worst([]) == OK
    assert worst([OK, OK]) == OK
    assert worst([OK, WARN, OK]) == WARN
    assert worst([WARN, STOP, OK]) == STOP


@pytest.mark.parametrize("failure", [ERROR, UNAVAILABLE])
def test_a_failed_check_is_never_healthy(failure):
    assert worst([OK, failure, OK]) == failure
    assert worst([failure]) == failure
    # a limit known to be reached says more than a figure that could not be had
    assert worst([failure, WARN]) == WARN
    assert worst([failure, STOP]) == STOP


def test_error_outranks_unavailable():
    assert worst([UNAVAILABLE, ERROR, OK]) == ERROR


# -- the book -----------------------------------------------------------------------------

CHECKS = (CheckEntry("ram", "ram", warn_free_pct=15, stop_free_pct=10),
          CheckEntry("data", "disk", "/data", stop_free_gib=10))


def test_checks_start_unmeasured_and_unhealthy_with_their_limits():
    book = HealthBook(CHECKS)
    ram = book.state("ram")
    assert (ram.level, ram.measurement, ram.reason) == (UNAVAILABLE, None, NOT_MEASURED)
    assert ram.limits == {"warn_free_pct": 15, "stop_free_pct": 10}
    assert book.health == UNAVAILABLE
    assert [s.name for s in book.states()] == ["ram", "data"]


def test_one_event_per_change_and_none_while_the_level_stays():
    book = HealthBook(CHECKS)
    assert book.update("data", OK, m(50 * GIB), "fine") == []  # a first OK is no news
    assert book.update("data", OK, m(40 * GIB), "still fine") == []
    assert book.state("data").measurement == m(40 * GIB)   # figures move without an event
    assert book.state("data").reason == "still fine"
    stop = book.update("data", STOP, m(GIB), "free 1G <= stop_free_gib 10")
    assert stop == [LevelChanged("data", OK, STOP, "free 1G <= stop_free_gib 10")]
    assert book.update("data", STOP, m(GIB // 2), "worse") == []
    assert book.update("data", OK, m(50 * GIB), "ok") == [LevelChanged("data", STOP, OK, "ok")]


def test_a_first_reading_that_is_not_ok_is_news():
    book = HealthBook(CHECKS)
    assert book.update("data", STOP, m(GIB), "low") == [LevelChanged("data", UNAVAILABLE, STOP,
                                                                     "low")]


def test_health_is_the_worst_check():
    book = HealthBook(CHECKS)
    book.update("ram", OK, m(50, 100), "")
    book.update("data", OK, m(50 * GIB), "")
    assert book.health == OK
    book.update("data", WARN, m(15 * GIB), "")
    assert book.health == WARN
    book.update("ram", STOP, m(5, 100), "")
    assert book.health == STOP


@pytest.mark.parametrize("failure", [ERROR, UNAVAILABLE])
def test_a_failed_reading_keeps_the_limits_and_drops_the_figures(failure):
    book = HealthBook(CHECKS)
    book.update("data", OK, m(50 * GIB), "")
    book.update("ram", OK, m(50, 100), "")
    events = book.update("data", failure, None, "/data: No such file or directory")
    assert events == [LevelChanged("data", OK, failure, "/data: No such file or directory")]
    state = book.state("data")
    assert (state.level, state.measurement) == (failure, None)
    assert state.limits == {"stop_free_gib": 10}
    assert book.health == failure


def test_update_refuses_levels_that_contradict_the_figures():
    book = HealthBook(CHECKS)
    with pytest.raises(ValueError):
        book.update("ram", OK, None, "")
    with pytest.raises(ValueError):
        book.update("ram", ERROR, m(1, 2), "")
    with pytest.raises(ValueError):
        book.update("ram", "PURPLE", m(1, 2), "")
    with pytest.raises(KeyError):
        book.update("nope", OK, m(1, 2), "")
    assert book.state("ram").level == UNAVAILABLE


def test_reconfigure_keeps_levels_adds_new_and_takes_down_removed():
    book = HealthBook(CHECKS)
    book.update("ram", OK, m(50, 100), "")
    book.update("data", STOP, m(GIB), "full")
    new = (CheckEntry("ram", "ram", warn_free_pct=60), CheckEntry("scratch", "disk", "/s"))
    events = book.configure(new)
    assert events == [LevelChanged("data", STOP, OK,
                                   "no longer checked (removed from the configuration)")]
    assert [s.name for s in book.states()] == ["ram", "scratch"]
    assert book.state("ram").level == OK and book.state("ram").limits == {"warn_free_pct": 60}
    assert book.state("scratch").level == UNAVAILABLE


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError):
        HealthBook((CheckEntry("a", "ram"), CheckEntry("a", "disk", "/")))


def test_core_health_imports_only_the_standard_library():
    probe = ("import json, sys; before = set(sys.modules); import resourced.core.health; "
             "print(json.dumps(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30, check=True)
    new = json.loads(done.stdout.splitlines()[-1])
    foreign = [n for n in new if n.split(".")[0] not in sys.stdlib_module_names | {"resourced"}]
    assert foreign == []
    assert not [n for n in new if n.split(".")[0] == "asyncio"]
