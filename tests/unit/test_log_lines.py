"""The daemon's stderr: one line per message (what a caller sent cannot start a line of
its own), tracebacks on lines of their own, audit lines with their fields, and the lines
of a held stretch in one write."""

import logging
import sys

import pytest

from resourced.linux import sd


class Stream:
    """A stderr that counts its writes."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def stderr(monkeypatch):
    def make(journal: bool):
        handler = sd.StderrHandler(journal)
        handler.setStream(Stream())
        monkeypatch.setattr(sd, "_stderr", handler)
        monkeypatch.setattr(sd, "_audit_stderr", handler)
        monkeypatch.setattr(sd, "_journal", None)
        return handler
    return make


def record_with_traceback(message: str) -> logging.LogRecord:
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        return logging.getLogger("resourced").makeRecord(
            "resourced", logging.ERROR, __file__, 1, message, None, sys.exc_info())


def test_a_traceback_keeps_its_lines_and_the_message_stays_one_line(stderr):
    handler = stderr(journal=False)
    handler.handle(record_with_traceback("boom\nforged line"))
    text = "".join(handler.stream.writes)
    assert text.startswith("resourced: boom\\x0aforged line\nTraceback (most recent call last):\n")
    assert text.rstrip("\n").endswith("ZeroDivisionError: division by zero")


def test_in_the_journal_each_line_of_a_traceback_carries_the_priority(stderr):
    handler = stderr(journal=True)
    handler.handle(record_with_traceback("boom"))
    lines = "".join(handler.stream.writes).splitlines()
    assert lines[0] == "<3>boom"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert all(line.startswith("<3>") for line in lines)


def test_an_audit_line_has_its_fields_and_escapes_what_a_caller_sent(stderr):
    handler = stderr(journal=False)
    sd.audit("released c1 (released): ", claim="c1", uid=1000, reason="bye\n<0>forged")
    assert handler.stream.writes == [
        ("resourced: released c1 (released):  resourced_claim=c1 resourced_uid=1000 "
         "resourced_reason=bye\\x0a<0>forged\n")]


def test_the_lines_of_a_held_stretch_leave_in_one_write(stderr):
    handler = stderr(journal=False)
    with sd.one_write():
        sd.audit("granted c1", claim="c1")
        logging.getLogger("resourced").addHandler(handler)
        try:
            logging.getLogger("resourced").warning("a warning")
        finally:
            logging.getLogger("resourced").removeHandler(handler)
        sd.audit("released c1", claim="c1")
        assert handler.stream.writes == []
    assert handler.stream.writes == [("resourced: granted c1 resourced_claim=c1\n"
                                      "resourced: a warning\n"
                                      "resourced: released c1 resourced_claim=c1\n")]
