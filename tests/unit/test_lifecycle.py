"""The lifecycles of claims, bookings and jobs (core.lifecycle): the tables are whole, every
change of state in the code goes through them, and a move outside them raises."""

import ast

import pytest

from resourced.core.ledger import Ledger
from resourced.core.lifecycle import (
    ACTIVE,
    BOOKING,
    CLAIM,
    ENDED,
    EXPIRED,
    GRANTED,
    JOB,
    LIFECYCLES,
    QUEUED,
    RELEASED,
    SCHEDULED,
)
from resourced.errors import Internal

from ..conftest import ROOT


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda c: c.name)
def test_every_state_is_reached_from_a_first_one_and_can_end(lifecycle):
    reached, todo = set(lifecycle.first), list(lifecycle.first)
    while todo:
        for new in lifecycle.moves.get(todo.pop(), ()):
            if new not in reached:
                reached.add(new)
                todo.append(new)
    assert reached == lifecycle.states
    assert lifecycle.final and lifecycle.final <= reached
    assert not lifecycle.first & lifecycle.final


def test_what_ends_stays_ended():
    assert CLAIM.final == BOOKING.final == {ENDED}
    with pytest.raises(Internal, match="a booking that is ended cannot become active"):
        BOOKING.move(ENDED, ACTIVE)
    with pytest.raises(Internal, match="a claim that is granted cannot become queued"):
        CLAIM.move(GRANTED, QUEUED)
    for final in JOB.final:
        assert not any(JOB.allows(final, state) for state in JOB.states)


def test_an_end_outside_the_table_raises():
    assert CLAIM.end(RELEASED) == RELEASED and BOOKING.end(EXPIRED) == EXPIRED
    assert CLAIM.end("booking-no-show") == "booking-no-show"
    with pytest.raises(Internal, match="'evicted' is not how a claim ends"):
        CLAIM.end("evicted")


def test_a_ledger_releases_only_for_a_reason_of_the_table():
    from .test_ledger import grant, inventory, request

    ledger = Ledger(inventory(1))
    grant(ledger, request(), "c1")
    with pytest.raises(Internal, match="'gone fishing' is not how a claim ends"):
        ledger.release("c1", "gone fishing")
    assert ledger.get("c1").state == GRANTED   # nothing changed
    ledger.release("c1", RELEASED)
    ledger.check_invariants()


STATE_WORDS = set().union(*(c.states | c.ends for c in LIFECYCLES))


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def places_that_spell_a_state():
    """(file, line, text) wherever the code sets a state, or ends a claim or a booking, with
    a bare string instead of the table's names."""
    found = []
    for path in sorted((ROOT / "resourced").rglob("*.py")):
        if path.name == "lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.Assign):
                values = [node.value for t in node.targets
                          if isinstance(t, ast.Attribute) and t.attr == "state"]
            elif isinstance(node, ast.Call):
                values = [k.value for k in node.keywords if k.arg in ("state", "ended")]
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in ("_end", "release") and len(node.args) >= 2:
                    values.append(node.args[1])
            for value in values:
                if (text := _string(value)) in STATE_WORDS:
                    found.append((str(path.relative_to(ROOT)), node.lineno, text))
    return found


def test_the_code_changes_states_only_by_the_tables_names():
    assert places_that_spell_a_state() == []


def test_the_walk_finds_a_bare_state(tmp_path, monkeypatch):
    """(The check above could pass by finding nothing: here it finds what it must.)"""
    fake = tmp_path / "resourced"
    fake.mkdir()
    (fake / "x.py").write_text('claim.state = "granted"\nengine._end(ref, "expired", None, "")\n'
                               f'b = replace(b, state={SCHEDULED!r})\n')
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert places_that_spell_a_state() == [("resourced/x.py", 1, "granted"),
                                           ("resourced/x.py", 2, "expired"),
                                           ("resourced/x.py", 3, "scheduled")]


def test_a_runner_cannot_move_a_command_back():
    from resourced.errors import InvalidArgs

    from .test_calendar import ALICE, ask, book, calendar

    cal = calendar()
    book(cal, ask(gpus=1), "b1")
    for state in ("pending", "running", "running", "succeeded"):
        cal.set_job("b1", ALICE, state)
    with pytest.raises(InvalidArgs, match="b1 is succeeded: it cannot become running"):
        cal.set_job("b1", ALICE, "running")


def test_every_claim_event_has_its_signals_in_the_one_table():
    """daemon/bus/signals.py ON_EVENT says what each engine event sends: a new event
    without a row would be lost on the bus."""
    from resourced.core import ledger
    from resourced.daemon.bus.signals import CHANGED, ON_EVENT, Signals

    events = {cls for cls in vars(ledger).values() if isinstance(cls, type)
              and issubclass(cls, ledger._ClaimEvent) and cls is not ledger._ClaimEvent}
    assert set(ON_EVENT) == events
    assert {e for e, (handler, _) in ON_EVENT.items() if handler is Signals._changed} == \
        set(CHANGED)
