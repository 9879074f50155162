"""gpuctl doctor's own checks, each on the files it reads (no daemon needed)."""

import os
import sys

import pytest

from resourced import __version__
from resourced.client import doctor
from resourced.core.diagnosis import FAIL, OK, SKIPPED, WARN, check, passed
from resourced.daemon.self_check import proc_visibility
from resourced.linux import install

VIEW = {"backend": "nvml", "gpus": [
    {"index": i, "alias": f"gpu{i}", "slurm": False} for i in range(4)]}


def test_a_slurm_split_that_overlaps_our_gpus_fails_and_names_them(tmp_path):
    gres = tmp_path / "gres.conf"
    gres.write_text("# two for Slurm\nName=gpu Type=h100 File=/dev/nvidia[0-1]\n"
                    "AutoDetect=off\n")
    found = doctor.slurm_split(VIEW, {}, str(gres))
    assert found["status"] == FAIL and found["detail"]["overlap"] == [0, 1]
    assert "gpu0, gpu1" in found["summary"] and "[slurm] gpus" in found["fix"]
    kept = {**VIEW, "gpus": [{**g, "slurm": g["index"] < 2} for g in VIEW["gpus"]]}
    assert doctor.slurm_split(kept, {}, str(gres))["status"] == OK


def test_no_gres_conf_is_skipped_with_the_file_named(tmp_path):
    found = doctor.slurm_split(VIEW, {"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert found["status"] == SKIPPED and str(tmp_path / "gres.conf") in found["summary"]


def test_missing_device_nodes_fail_for_nvml_and_are_skipped_for_simulated(tmp_path):
    found = doctor.device_nodes(VIEW, str(tmp_path))
    assert found["status"] == FAIL
    assert found["detail"]["missing"] == ["nvidiactl", "nvidia0", "nvidia1", "nvidia2", "nvidia3"]
    assert doctor.device_nodes({**VIEW, "backend": "simulated"})["status"] == SKIPPED


def test_device_nodes_present(tmp_path):
    try:
        for name, minor in (("nvidiactl", 255), *((f"nvidia{i}", i) for i in range(4))):
            os.mknod(tmp_path / name, 0o600 | 0o020000, os.makedev(195, minor))
    except PermissionError:
        pytest.skip("mknod is not permitted here")
    found = doctor.device_nodes(VIEW, str(tmp_path))
    assert found["status"] == OK and "nvidia-uvm appears" in found["summary"]


def test_proc_mounted_with_hidepid_warns_unless_the_daemon_is_exempt(tmp_path, monkeypatch):
    mounts = tmp_path / "mountinfo"
    mounts.write_text("22 1 0:5 / /proc rw,nosuid - proc proc rw,hidepid=invisible,gid=27\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [1000])
    found = proc_visibility(str(mounts))
    assert found["status"] == WARN and "hidepid=invisible" in found["summary"]
    assert "gid=GROUP" in found["fix"]
    monkeypatch.setattr(os, "getgroups", lambda: [1000, 27])
    assert proc_visibility(str(mounts))["status"] == OK
    mounts.write_text("22 1 0:5 / /proc rw,nosuid - proc proc rw\n")
    monkeypatch.setattr(os, "getgroups", lambda: [1000])
    assert proc_visibility(str(mounts))["status"] == OK


def _install(tmp_path, config="/etc/resourced/config.toml"):
    plan = install.plan_enable(install.SYSTEM, sys.executable, config, tmp_path)
    for f in plan.write:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_text(f.content)
    return plan


def test_the_files_enable_wrote_show_no_drift_whatever_their_values(tmp_path):
    _install(tmp_path, "/srv/resourced.toml")
    assert install.installed_modes(tmp_path) == [install.SYSTEM]
    assert install.drift(install.SYSTEM, tmp_path) == []


def test_a_changed_or_missing_file_is_named(tmp_path):
    plan = _install(tmp_path)
    policy = next(f.path for f in plan.write if f.path.name == "org.resourced.conf")
    policy.write_text(policy.read_text().replace("org.resourced", "org.other", 1))
    rules = next(f.path for f in plan.write if f.path.suffix == ".rules")
    rules.unlink()
    found = dict(install.drift(install.SYSTEM, tmp_path))
    assert found[rules] == "missing"
    assert found[policy].startswith("line ") and "dbus/org.resourced.conf" in found[policy]
    assert len(found) == 2


def test_a_broken_configuration_fails_with_its_problem(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text("[daemon]\nsample_interval = -1\n")
    found, config = doctor.configuration("session", {"RESOURCED_CONFIG": str(bad)})
    assert found["status"] == FAIL and "sample_interval" in found["summary"]
    assert "gpuctl config check" in found["fix"] and config is None
    good = tmp_path / "good.toml"
    good.write_text("[daemon]\nsample_interval = 5\n")
    assert doctor.configuration("session", {"RESOURCED_CONFIG": str(good)})[0]["status"] == OK


def test_another_daemon_version_warns():
    assert doctor.version(__version__)["status"] == OK
    older = doctor.version("0.0.1")
    assert older["status"] == WARN and "restart" in older["fix"]


def test_strict_fails_on_a_warning_and_skipped_never_fails():
    checks = [check("a", OK, "."), check("b", SKIPPED, "."), check("c", WARN, ".", "do")]
    assert passed(checks) and not passed(checks, strict=True)
    assert not passed([*checks, check("d", FAIL, ".", "do")])
    with pytest.raises(ValueError):
        check("e", "fine", ".")


def test_the_metrics_textfile_must_be_there_and_current(tmp_path):
    prom = tmp_path / "resourced.prom"
    config = tmp_path / "config.toml"
    config.write_text(f'[daemon]\nsample_interval = 10\n[metrics]\ntextfile = "{prom}"\n')
    env = {"RESOURCED_CONFIG": str(config)}

    def textfile(**kw):
        return doctor.textfile(doctor.configuration("session", env)[1], **kw)

    assert textfile()["status"] == FAIL  # not written
    prom.write_text("resourced_gpus_free 1\n")
    assert textfile()["status"] == OK
    stale = textfile(now=prom.stat().st_mtime + 60)
    assert stale["status"] == FAIL and "60 s ago" in stale["summary"]
    config.write_text("")
    assert textfile()["status"] == SKIPPED
    config.write_text("[daemon]\nsample_interval = -1\n")
    assert textfile()["status"] == SKIPPED  # unreadable: said by the config check
