"""The calls each client lacked before they were written once, against a real daemon, on
``Client`` and ``AsyncClient`` alike: every test runs on both (``kind``)."""

import asyncio
import json
import os
import threading
import time

import pytest

from resourced.client.aio import AsyncClient
from resourced.client.sync import Client
from resourced.errors import NoSuchClaim

from .conftest import at
from .test_health_levels import config, fill, small_disk  # noqa: F401 - and its fixture
from .test_slurm_jobs import slurm_daemon  # noqa: F401 - the fixture

TIMEOUT = 10


class Awaited:
    """An ``AsyncClient`` called as a blocking one: each call awaited on a loop of its own
    (one loop for the client's life, as its router is bound to it)."""

    def __init__(self, **options):
        self.loop = asyncio.new_event_loop()
        self.client = AsyncClient(**options)

    def __getattr__(self, name):
        call = getattr(self.client, name)

        def awaited(*args, **kwargs):
            return self.loop.run_until_complete(asyncio.wait_for(call(*args, **kwargs),
                                                                 TIMEOUT))
        return awaited

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(params=["blocking", "awaited"])
def kind(request):
    return request.param


def client(kind: str):
    return Client(timeout=5) if kind == "blocking" else Awaited(timeout=5)


def test_bookings_json_blackouts_notices_jobs_and_usage(clocked_daemon, kind):
    clocked_daemon(gpus=2)
    with client(kind) as c:
        made = c.book("1h", gpus=1, start="2026-12-01T10:00:00Z")["booking"]
        text = c.bookings_json()
        assert isinstance(text, str) and json.loads(text) == c.bookings()
        assert [b["id"] for b in json.loads(c.bookings_json(all_users=True, limit=1))] == [
            made["id"]]
        reported = c.report_job(made["id"], "pending")
        assert (reported["id"], reported["job"]) == (made["id"], "pending")

        blackout = c.add_blackout("2026-12-01T12:00:00Z", "2026-12-01T13:00:00Z", "fans")
        assert blackout["bookings_inside"] == []
        assert c.blackouts() == [{"id": blackout["id"], "reason": "fans",
                                  "start_usec": at("2026-12-01T12:00:00Z"),
                                  "end_usec": at("2026-12-01T13:00:00Z")}]
        c.remove_blackout(blackout["id"])
        assert c.blackouts() == []

        notice = c.add_notice("new fans on Friday")
        assert [(n["id"], n["text"]) for n in c.notices()] == [(notice, "new fans on Friday")]
        c.remove_notice(notice)
        with pytest.raises(NoSuchClaim):
            c.remove_notice(notice)

        assert isinstance(c.usage(by_gpu=True), list)
        assert json.loads(c.status_json()) == c.status()


def test_a_slurm_jobs_claim_is_made_and_ended(slurm_daemon, kind):  # noqa: F811 - the fixture
    with client(kind) as c:
        ref = c.claim_job("50", ["gpu2"], name="train.sh")
        assert [x["id"] for x in c.status()["claims"] if x["mode"] == "slurm"] == [ref]
        assert c.release_job("50") == [ref]
        assert c.release_job("50") == []


def test_a_waiting_claim_reports_its_place_and_is_granted(daemon, kind):
    with Client() as other:
        held = other.claim(gpus=4, owner_pid=os.getpid())["allocation"]["ref"]
        told = []

        def progress(place):
            told.append(place)
            if len(told) == 1:
                other.release(held)

        with client(kind) as c:
            granted = c.claim(gpus=1, owner_pid=os.getpid(), wait=True, timeout=TIMEOUT,
                              progress=progress)
            assert (told[0]["position"], told[0]["waiting"]) == (1, 1)
            assert [h["id"] for h in told[0]["holders"]] == [held]
            c.release(granted["allocation"]["ref"])
            assert c.status()["claims"] == []


def test_no_level_change_in_time_is_a_timeout(daemon, kind):
    with client(kind) as c:
        with pytest.raises(TimeoutError):
            c.wait_level_change(timeout=0.3)
        assert c.free() == 4  # the connection lives on


def test_the_blocking_client_hears_level_changes_as_the_async_one_does(
        start_daemon, tmp_path, small_disk):  # noqa: F811 - the fixture
    start_daemon(args=["--config", config(tmp_path, small_disk)])
    with Client() as c:
        threading.Timer(0.5, fill, (small_disk, 9)).start()  # 10 % free: STOP
        stop = c.wait_level_change(check="scratch", levels=("STOP",), timeout=TIMEOUT)
        assert (stop["check"], stop["new"]) == ("scratch", "STOP")
    seen = []

    def listen():
        with Client() as c:
            for change in c.level_changes(check="scratch"):
                seen.append(change)
                break

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    time.sleep(0.5)  # for the listener to add its match rule: nothing tells when it has
    (small_disk / "fill").unlink()  # back to OK
    listener.join(TIMEOUT)
    assert [(c["old"], c["new"]) for c in seen] == [("STOP", "OK")]


def test_a_call_the_async_client_closes_under_is_cancelled_not_failed(daemon):
    """A task still waiting on the bus when ``async with AsyncClient()`` ends (the README's
    wait_level_change beside a training loop) failed with jeepney's KeyError, logged as
    a traceback by asyncio since nobody awaits it any more."""
    async def scenario():
        async with AsyncClient() as c:
            await c.ping()
            waiting = asyncio.ensure_future(c.wait_level_change())
            await asyncio.sleep(0)  # it has sent its first call, and waits for the answer
        await asyncio.wait([waiting], timeout=10)
        return waiting

    waiting = asyncio.run(scenario())
    assert waiting.cancelled(), waiting.exception()
