"""Health levels end to end: a disk check on a small tmpfs we fill, signals, figures, CLI."""

import asyncio
import contextlib
import json
import os
import subprocess

import pytest

from resourced.client.aio import AsyncClient
from resourced.client.sync import Client

from ..conftest import eventually, eventually_async, gpuctl

MIB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A 10 MiB tmpfs (needs root to mount; skipped elsewhere)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=10M", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk, mib: int) -> None:
    (disk / "fill").write_bytes(b"\0" * (mib * MIB))


def config(tmp_path, disk) -> str:
    path = tmp_path / "config.toml"
    path.write_text(
        "[daemon]\nsample_interval = 0.2\n"
        f'[[check]]\nname = "scratch"\ntype = "disk"\npath = "{disk}"\n'
        "warn_free_pct = 50\nstop_free_pct = 20\n"
    )
    return str(path)


async def subscribed(client: AsyncClient) -> None:
    """Return once a subscription just started on ``client`` is in place: it sends its
    AddMatch when first scheduled, and the bus answers a call behind it after."""
    await asyncio.sleep(0)
    await client.ping()


async def sampled(client: AsyncClient, free_pct: float) -> None:
    """Wait until the figures show ``free_pct`` free: a sample since the disk changed.
    A signal of that sample reached ``client`` before this answer."""
    async def shown():
        return abs((await client.resources())["checks"][0]["free_pct"] - free_pct) <= 2
    await eventually_async(shown, what=f"{free_pct:g} % free in the figures")


def test_each_level_change_is_signalled_exactly_once(start_daemon, tmp_path, small_disk):
    start_daemon(args=["--config", config(tmp_path, small_disk)])
    with Client() as c:
        assert c.resources()["level"] == "OK"

    async def watch():
        async with AsyncClient() as client:
            seen = []

            async def collect():
                async for change in client.level_changes(check="scratch"):
                    seen.append(change)

            await client.ping()
            task = asyncio.ensure_future(collect())
            await subscribed(client)
            fill(small_disk, 6)           # 40 % free: WARN
            await sampled(client, 40)
            fill(small_disk, 7)           # 30 % free: another sample at WARN, no new signal
            await sampled(client, 30)
            fill(small_disk, 9)           # 10 % free: STOP
            await sampled(client, 10)
            (small_disk / "fill").unlink()  # back to OK
            await sampled(client, 100)
            fill(small_disk, 1)           # 90 % free: another sample at OK
            await sampled(client, 90)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            waiter = asyncio.ensure_future(client.wait_level_change(levels=("STOP",), timeout=5))
            await subscribed(client)
            fill(small_disk, 9)
            stop = await waiter
            assert (stop["check"], stop["new"]) == ("scratch", "STOP")
            return seen

    seen = asyncio.run(asyncio.wait_for(watch(), 20))
    assert [(e["old"], e["new"]) for e in seen] == [("OK", "WARN"), ("WARN", "STOP"), ("STOP", "OK")]
    assert "free" in seen[1]["reason"] and "stop_free_pct" in seen[1]["reason"]


def test_figures_and_limits_are_visible_and_the_cli_shows_them(start_daemon, tmp_path, small_disk):
    start_daemon(args=["--config", config(tmp_path, small_disk)])
    fill(small_disk, 9)
    with Client() as c:
        eventually(lambda: c.resources()["level"] == "STOP", timeout=5)
    r = gpuctl("resources", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["source"] == "daemon"
    (check,) = data["checks"]
    assert check["level"] == "STOP"
    assert check["limits"] == {"warn_free_pct": 50.0, "stop_free_pct": 20.0}
    assert check["total_bytes"] == 10 * MIB
    busctl = subprocess.run(
        ["busctl", f"--address={os.environ['DBUS_SESSION_BUS_ADDRESS']}", "get-property",
         "org.resourced", "/org/resourced/check/scratch", "org.resourced.Check", "Level"],
        capture_output=True, text=True, timeout=10)
    assert busctl.stdout.strip() == 's "STOP"'


def test_a_missing_disk_path_is_an_error_never_healthy(start_daemon, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(f'[[check]]\nname = "gone"\ntype = "disk"\npath = "{tmp_path}/nowhere"\n'
                    "stop_free_gib = 1\n")
    start_daemon(args=["--config", str(path)])
    with Client() as c:
        health = c.resources()
    assert health["level"] == "ERROR"
    assert health["checks"][0]["limits"] == {"stop_free_gib": 1.0}


def test_levels_never_block_claims(start_daemon, tmp_path, small_disk):
    d = start_daemon(args=["--config", config(tmp_path, small_disk)])
    fill(small_disk, 9)
    with Client() as c:
        eventually(lambda: c.resources()["level"] == "STOP", timeout=5)
        c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)


def test_a_daemon_that_starts_healthy_announces_no_level_change(start_daemon, tmp_path):
    """No previous level, nothing to change from: a start with every check OK says nothing
    (it used to log and signal UNAVAILABLE -> OK for each check)."""
    path = tmp_path / "config.toml"
    path.write_text('[[check]]\nname = "root"\ntype = "disk"\npath = "/"\nstop_free_pct = 0\n')
    d = start_daemon(args=["--config", str(path)])
    with Client() as c:
        assert c.resources()["level"] == "OK"
    assert "check root:" not in d.log()
