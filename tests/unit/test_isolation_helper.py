"""What the isolation helper agrees to move (resourced.isolation.helper): only processes
of the claim's user, never root's, and only from that user's slice."""

import os
import subprocess

import pytest
from dbus_fast import DBusError

from resourced.isolation.helper import pin_users_processes, refusal, unit_of

SESSION = "/user.slice/user-1000.slice/session-3.scope"


@pytest.mark.parametrize("uids, cgroup, why", [
    ([1000] * 4, SESSION, None),
    ([1000] * 4, "/user.slice/user-1000.slice/user@1000.service/app.slice/x.service", None),
    ([0] * 4, "/user.slice/user-0.slice/session-1.scope", "runs as root"),
    ([1000, 0, 1000, 1000], SESSION, "runs as root"),  # setuid root: root's now
    ([1001] * 4, "/user.slice/user-1001.slice/session-4.scope", "belongs to uid 1001"),
    ([1000, 1000, 1001, 1000], SESSION, "belongs to uid 1000, not to the claim's user"),
    ([1000] * 4, "/system.slice/cron.service", "outside user-1000.slice"),
    ([1000] * 4, "/system.slice/slurmstepd.scope/job_7/step_0", "outside user-1000.slice"),
    ([1000] * 4, "/user.slice/user-10000.slice/session-9.scope", "outside user-1000.slice"),
    ([1000] * 4, "", "runs in no cgroup"),
])
def test_only_the_claims_users_processes_in_their_slice_are_moved(uids, cgroup, why):
    said = refusal(42, 1000, uids, cgroup)
    assert (said is None) if why is None else (why in said), said


def test_a_claim_of_root_confines_nothing():
    assert "runs as root" in refusal(42, 0, [0] * 4, "/user.slice/user-0.slice/session-1.scope")


@pytest.mark.parametrize("cgroup, unit", [
    ("/user.slice/user-1000.slice/session-3.scope", ("session-3.scope", "")),
    ("/system.slice/slurmstepd.scope/job_7/step_0", ("slurmstepd.scope", "/job_7/step_0")),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/x.service", ("x.service", "")),
    ("/user.slice", None),
    ("/", None),
])
def test_a_pid_put_back_goes_to_the_unit_that_holds_its_parents_cgroup(cgroup, unit):
    assert unit_of(cgroup) == unit


def test_a_process_that_is_gone_is_said_to_be_so():
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(DBusError) as refused:
        pin_users_processes([child.pid], os.getuid() or 1000)
    assert refused.value.text == f"process {child.pid} does not exist"


def test_a_process_of_another_user_is_refused_and_nothing_stays_open():
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(DBusError) as refused:
        pin_users_processes([os.getpid()], os.getuid() + 1)
    assert refused.value.type == "org.resourced.Isolation.Error.ProcessRefused"
    assert len(os.listdir("/proc/self/fd")) == before
