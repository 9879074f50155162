"""Shell completion through click: subcommands, and claim references and GPU names from the
daemon (nothing, quietly, when there is no daemon)."""

import os
import subprocess
import sys

import pytest

from resourced.client.sync import Client


def complete(words: str) -> list[str]:
    """What bash completion offers for ``words`` (the last one being completed)."""
    env = {**os.environ, "_GPUCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split(" ")) - 1)}
    r = subprocess.run([sys.executable, "-m", "resourced.cli"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert (r.returncode, r.stderr) == (0, "")
    return [line.split(",", 1)[1] for line in r.stdout.splitlines() if line]


@pytest.mark.parametrize("words, offered", [
    ("gpuctl rel", ["release"]),
    ("gpuctl st", ["status", "stop"]),
    ("gpuctl release --gpu gpu", ["gpu0", "gpu1", "gpu2", "gpu3"]),
])
def test_subcommands_and_gpus(daemon, words, offered):
    assert complete(words) == offered


def test_claim_references_come_from_the_daemon(daemon):
    with Client() as c:
        ref = c.claim(owner_pid=os.getpid())["allocation"]["ref"]
    assert complete("gpuctl release --allocation ") == [ref]
    assert complete(f"gpuctl env --allocation {ref[:3]}") == [ref]


def test_without_a_daemon_nothing_is_offered(private_bus, monkeypatch):
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", private_bus.address)
    monkeypatch.setenv("RESOURCED_BUS", "session")
    assert complete("gpuctl release --allocation ") == []
