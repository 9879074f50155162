from resourced.client.sync import Client

from ..conftest import gpuctl


def test_claim_and_release_through_client(daemon):
    with Client() as c:
        claim = c.claim(mode="dev", gpus=2, owner_pid=daemon.proc.pid, task_name="t")
        assert c.free() == 2
        c.release(claim["allocation"]["ref"])
        assert c.free() == 4


def test_gpuctl_free(daemon):
    r = gpuctl("free")
    assert (r.returncode, r.stdout.strip()) == (0, "4")
