"""What /proc says of a process in a container: its container, and the claim it names."""

import pytest

from resourced.evidence import pidns


@pytest.fixture
def proc(tmp_path, monkeypatch):
    monkeypatch.setattr(pidns, "PROC", str(tmp_path))

    def write(pid: int, name: str, content: bytes) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / name).write_bytes(content)
    return write


@pytest.mark.parametrize("cgroup, named", [
    (b"0::/system.slice/docker-3f2a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8.scope\n",
     "docker container 3f2a1b2c3d4e"),
    (b"0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
     b"libpod-9c1b2a3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9.scope/container\n",
     "podman container 9c1b2a3d4e5f"),
    (b"12:devices:/docker/" + b"ab" * 32 + b"\n", "container " + "ab" * 6),
    (b"0::/user.slice/user-0.slice/session-3.scope\n", ""),
])
def test_the_container_is_named_from_the_cgroup(proc, cgroup, named):
    proc(42, "cgroup", cgroup)
    assert pidns.container_of(42) == named


def test_the_claim_a_process_names_in_its_environment(proc):
    proc(42, "environ", b"PATH=/bin\0RESOURCED_ALLOCATION=c4x9k2a\0HOME=/\0")
    proc(43, "environ", b"PATH=/bin\0")
    assert pidns.claim_named_by(42) == "c4x9k2a"
    assert pidns.claim_named_by(43) == "" and pidns.claim_named_by(44) == ""


def test_nspid_levels(proc):
    proc(42, "status", b"Name:\tsh\nPPid:\t7\nNSpid:\t42\t1\n")
    proc(43, "status", b"Name:\tsh\nPPid:\t7\nNSpid:\t43\n")
    assert pidns.ns_pids(42) == [42, 1] and pidns.nested(42)
    assert not pidns.nested(43) and pidns.ns_pids(44) is None
    assert pidns.in_callers_namespace(43, 77) == 77  # a caller in ours: as given
    assert pidns.in_callers_namespace(42, 1) == 42
