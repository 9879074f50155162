"""gpuctl doctor and gpuctl metrics against a real daemon on the private bus."""

import json
import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import eventually, gpuctl

EXIT_CHECK_FAILED = 13


@pytest.fixture(autouse=True)
def _own_homes(tmp_path, monkeypatch):
    """No configuration or user service of the machine's in view."""
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))


def doctor(*args):
    done = gpuctl("doctor", "--json", *args, timeout=60)
    data = json.loads(done.stdout)
    assert data["exit_code"] == done.returncode, done.stderr
    return done, data, {c["id"]: c for c in data["checks"]}


def samples(text: str) -> dict:
    """(name, sorted labels) -> value, as prometheus_client's parser reads the text."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_healthy_daemon_passes_with_every_check_named(daemon):
    done, data, checks = doctor()
    assert done.returncode == 0 and data["ok"] is True
    for c in data["checks"]:
        assert c["id"] and c["status"] in ("ok", "warn", "fail", "skipped"), c
        assert c["summary"]
        assert c["status"] == "ok" or c["fix"] or c["status"] == "skipped", c
    assert checks["bus"]["status"] == "ok" and checks["bus"]["detail"]["bus"] == "session"
    for id in ("version", "config", "daemon.runtime-dir", "daemon.state-dir",
               "daemon.gpu-backend", "daemon.gpus"):
        assert checks[id]["status"] == "ok", checks[id]
    assert checks["daemon.gpus"]["detail"]["managed"] == 4
    assert checks["devices"]["status"] == "skipped"  # simulated GPUs have no nodes
    assert checks["daemon.runtime-dir"]["detail"]["path"] == str(daemon.runtime_dir)
    text = gpuctl("doctor")
    assert text.returncode == 0
    assert any(line.startswith("ok") and " bus " in line for line in text.stdout.splitlines())


def test_with_the_daemon_down_it_fails_and_says_how_to_start_it(private_bus):
    done, data, checks = doctor()
    assert done.returncode == EXIT_CHECK_FAILED and data["ok"] is False
    assert checks["bus"]["status"] == "fail"
    assert "start" in checks["bus"]["fix"] and "resourced" in checks["bus"]["fix"]
    assert "config" in checks  # what can be checked without a daemon still is
    text = gpuctl("doctor")
    assert text.returncode == EXIT_CHECK_FAILED and "fix: start the daemon" in text.stdout


def test_a_broken_configuration_fails(daemon, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nsample_interval = 'often'\n")
    done = gpuctl("doctor", "--json", env={"RESOURCED_CONFIG": str(bad)})
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == EXIT_CHECK_FAILED
    assert checks["config"]["status"] == "fail" and "sample_interval" in checks["config"]["summary"]


def test_strict_fails_on_a_warning(daemon, tmp_path):
    old = tmp_path / "old.toml"
    old.write_text('[daemon]\nnvidia_smi = "/usr/bin/nvidia-smi"\n')  # read, and noted
    env = {"RESOURCED_CONFIG": str(old)}
    assert gpuctl("doctor", env=env).returncode == 0
    strict = gpuctl("doctor", "--strict", "--json", env=env)
    assert strict.returncode == EXIT_CHECK_FAILED
    assert json.loads(strict.stdout)["strict"] is True


def test_probe_claims_and_books_and_leaves_nothing_behind(daemon):
    before = json.loads(gpuctl("status", "--json").stdout)
    done, _, checks = doctor("--probe")
    assert done.returncode == 0, checks
    assert checks["probe.claim"]["status"] == "ok"
    assert checks["probe.claim"]["detail"]["claim_ms"] >= 0
    assert checks["probe.booking"]["status"] == "ok", checks["probe.booking"]
    after = json.loads(gpuctl("status", "--json").stdout)
    assert after["claims"] == before["claims"] == []
    assert after["bookings_scheduled"] == 0 and after["free"] == 4
    _, _, plain = doctor()
    assert not any(id.startswith("probe.") for id in plain)  # nothing is tried without it


def test_metrics_agree_with_status(daemon, owner):
    ref = gpuctl("claim", "--gpus", "2", "--owner-pid", str(owner.pid)).stdout.strip()
    assert ref
    gpuctl("release", "--allocation", "nosuch")  # an error, counted
    status = json.loads(gpuctl("status", "--json").stdout)
    done = gpuctl("metrics")
    assert done.returncode == 0
    found = samples(done.stdout)
    user = status["claims"][0]["user"]
    assert found[("resourced_gpus_free", ())] == status["free"] == 2
    states = {g["state"] for g in status["gpus"]}
    for state in ("free", "claimed", "shared", "busy", "slurm"):
        expected = sum(g["state"] == state for g in status["gpus"])
        assert found[("resourced_gpus", (("state", state),))] == expected
    assert states == {"free", "claimed"}
    assert found[("resourced_claims", (("mode", "dev"), ("state", "granted"), ("user", user)))] == 1
    assert found[("resourced_claimed_gpus", (("mode", "dev"), ("user", user)))] == 2
    assert found[("resourced_queue_length", ())] == 0
    assert found[("resourced_requests_total", (("method", "Claim"),))] == 1
    errors = {k: v for k, v in found.items() if k[0] == "resourced_request_errors_total"}
    assert errors == {("resourced_request_errors_total",
                       (("error", "org.resourced.Error.NoSuchClaim"), ("method", "Release"))): 1}
    assert found[("resourced_daemon_starts_total", ())] == 1
    assert found[("resourced_daemon_resident_memory_bytes", ())] > 1 << 20
    assert found[("resourced_health", (("level", status["health"]["level"]),))] == 1


def test_the_textfile_follows_a_claim_at_once(start_daemon, tmp_path, owner):
    prom = tmp_path / "textfile" / "resourced.prom"
    prom.parent.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'[metrics]\ntextfile = "{prom}"\n')
    start_daemon(args=("--config", str(config)))
    eventually(prom.exists, 5, what="the textfile written at start")
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    found = {c["id"]: c for c in json.loads(gpuctl(
        "doctor", "--json", env={"RESOURCED_CONFIG": str(config)}).stdout)["checks"]}
    assert found["metrics"]["status"] == "ok", found["metrics"]
    assert samples(prom.read_text())[("resourced_gpus_free", ())] == 4
    claim = gpuctl("claim", "--gpus", "3", "--owner-pid", str(owner.pid))
    assert claim.returncode == 0, claim.stderr
    # at the change, not at the next sample (every 30 s by default): within 10 s is far
    # from either on a loaded machine
    eventually(lambda: samples(prom.read_text())[("resourced_gpus_free", ())] == 1, 10.0,
               what="the textfile to show the claim")
    assert gpuctl("release", "--allocation", claim.stdout.strip()).returncode == 0
    eventually(lambda: samples(prom.read_text())[("resourced_gpus_free", ())] == 4, 5,
               what="the textfile to show the release")
    assert [p.name for p in prom.parent.iterdir()] == ["resourced.prom"]  # no temporary left


def test_starts_are_counted_across_restarts(start_daemon, tmp_path):
    first = start_daemon()
    assert first.stop() == 0
    start_daemon(runtime_dir=first.runtime_dir)
    found = samples(gpuctl("metrics").stdout)
    assert found[("resourced_daemon_starts_total", ())] == 2
    assert found[("resourced_daemon_start_time_seconds", ())] <= time.time()


def test_a_textfile_that_cannot_be_written_is_logged_and_the_daemon_serves(start_daemon,
                                                                           tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[metrics]\ntextfile = "{tmp_path}/nosuchdir/resourced.prom"\n')
    d = start_daemon(args=("--config", str(config)))
    assert gpuctl("free").stdout.strip() == "4"
    eventually(lambda: "cannot write the metrics" in d.log(), 5)
    assert d.log().count("cannot write the metrics") == 1  # said once, not at every change
    assert os.path.exists(tmp_path / "nosuchdir") is False


def test_a_reload_starts_the_textfile_the_configuration_now_names(start_daemon, tmp_path):
    import signal

    config = tmp_path / "config.toml"
    config.write_text("")
    d = start_daemon(args=("--config", str(config)))
    prom = tmp_path / "resourced.prom"
    config.write_text(f'[metrics]\ntextfile = "{prom}"\n')
    d.proc.send_signal(signal.SIGHUP)
    eventually(prom.exists, 5, what="the textfile after the reload")
    assert samples(prom.read_text())[("resourced_gpus_free", ())] == 4
