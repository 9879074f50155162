"""Which device nodes a claim's scope allows: named by major and minor from the nodes
themselves, the uvm group from /proc/devices, and nothing for a node that is not there."""

import os
import stat
from types import SimpleNamespace

from resourced.isolation.devices import allowed, char_node, uvm_groups

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
236 nvidia-caps
507 nvidia-uvm
508 nvidia-uvm-tools

Block devices:
  7 loop
507 nvidia-uvm-fake-block
"""


def fake_dev(nodes: dict[str, tuple[int, int]]):
    """``os.stat`` over a /dev holding these character nodes (name -> major, minor)."""
    def stat_of(path):
        name = path.rsplit("/", 1)[-1]
        if name not in nodes:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_mode=stat.S_IFCHR | 0o666, st_rdev=os.makedev(*nodes[name]))
    return stat_of


def test_the_granted_gpus_and_the_shared_nodes_by_major_and_minor():
    dev = fake_dev({"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidia2": (195, 2),
                    "nvidiactl": (195, 255), "nvidia-uvm": (507, 0)})

    got = allowed([2, 0], proc_devices=PROC_DEVICES, stat_of=dev)

    assert got == [("/dev/char/195:0", "rw"), ("/dev/char/195:2", "rw"),
                   ("/dev/char/195:255", "rw"), ("/dev/char/507:0", "rw"),
                   ("char-nvidia-uvm", "rw"), ("char-nvidia-uvm-tools", "rw"),
                   ("char-pts", "rw")]
    assert ("/dev/char/195:1", "rw") not in got


def test_uvm_is_allowed_by_its_group_before_its_node_exists():
    got = allowed([0], proc_devices=PROC_DEVICES,
                  stat_of=fake_dev({"nvidia0": (195, 0), "tty": (5, 0)}))
    assert got == [("/dev/char/195:0", "rw"), ("/dev/char/5:0", "rw"),
                   ("char-nvidia-uvm", "rw"), ("char-nvidia-uvm-tools", "rw"),
                   ("char-pts", "rw")]


def test_only_character_groups_count():
    assert uvm_groups(PROC_DEVICES) == ["char-nvidia-uvm", "char-nvidia-uvm-tools"]
    assert uvm_groups("") == []


def test_a_missing_node_or_one_that_is_no_character_device_is_left_out(tmp_path):
    (tmp_path / "plain").write_text("")
    assert char_node(str(tmp_path / "plain")) is None
    assert char_node(str(tmp_path / "absent")) is None
    assert char_node("/dev/null") == "/dev/char/1:3"
