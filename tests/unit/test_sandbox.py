"""A bus socket this process may not open: a sandbox's refusal, or another user's bus."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from resourced.client.sandbox import ADVICE, refused

DENIED = PermissionError(13, "Permission denied")


@pytest.fixture
def open_folder():
    """A folder everyone may enter (pytest's own tmp_path is closed to other accounts)."""
    where = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_a_socket_in_another_users_closed_folder_is_said_to_be_theirs(open_folder):
    """It was blamed on a sandbox ('a coding agent's sandbox must allow connecting')."""
    if os.getuid() != 0:
        pytest.skip("needs root, to give a folder to another account")
    theirs = open_folder / "run-user-65534"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    socket = str(theirs / "bus")
    pid = os.fork()
    if pid == 0:  # as another account, which may not enter the folder
        try:
            os.setgid(1)
            os.setuid(1)
            message = str(refused("session", DENIED, socket))
            ok = f"it is in {theirs}, which belongs to" in message and ADVICE not in message \
                and "'s session bus, not yours" in message
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_socket_in_a_folder_of_our_own_is_a_sandboxs_refusal(tmp_path):
    message = str(refused("session", DENIED, str(tmp_path / "bus")))
    assert ADVICE in message and "not yours" not in message
