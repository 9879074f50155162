"""FileWatch: a file's changes pushed to the event loop (the simulated clock's path)."""

import asyncio
import os

import pytest

from resourced.linux.inotify import FileWatch

HANG = 10.0  # a bound against a hang, not a figure


async def _changes(path, act) -> int:
    """How many times ``changed`` was called for ``path`` after ``act()``, once a marker
    file written after it has been seen (inotify reports in order)."""
    seen, marker = [], asyncio.Event()
    watch = FileWatch(path, lambda: seen.append(1))
    mark = FileWatch(path.with_name("marker"), marker.set)
    try:
        act()
        path.with_name("marker").write_text("x")
        await asyncio.wait_for(marker.wait(), HANG)
        return len(seen)
    finally:
        watch.close()
        mark.close()


def test_a_file_replaced_whole_is_seen(tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("2026-12-01T09:00:00Z\n")

    def replace():
        (tmp_path / "clock.tmp").write_text("2026-12-01T10:00:00Z\n")
        os.replace(tmp_path / "clock.tmp", clock)

    assert asyncio.run(_changes(clock, replace)) == 1


def test_a_file_written_in_place_or_created_is_seen(tmp_path):
    clock = tmp_path / "clock"
    assert asyncio.run(_changes(clock, lambda: clock.write_text("now\n"))) >= 1


def test_other_files_in_the_folder_are_not_its_changes(tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("now\n")
    assert asyncio.run(_changes(clock, lambda: (tmp_path / "other").write_text("x"))) == 0


def test_a_folder_that_cannot_be_watched_is_an_oserror(tmp_path):
    async def watch():
        FileWatch(tmp_path / "missing" / "clock", lambda: None)

    with pytest.raises(OSError, match="missing"):
        asyncio.run(watch())


def test_after_close_nothing_is_called(tmp_path):
    clock = tmp_path / "clock"

    async def scenario():
        seen, marker = [], asyncio.Event()
        FileWatch(clock, lambda: seen.append(1)).close()
        mark = FileWatch(clock.with_name("marker"), marker.set)
        try:
            clock.write_text("now\n")
            clock.with_name("marker").write_text("x")  # seen once the clock's write is too
            await asyncio.wait_for(marker.wait(), HANG)
        finally:
            mark.close()
        return seen

    assert asyncio.run(scenario()) == []
