"""gpuctl doctor and gpuctl metrics on the system service, installed by `gpuctl service
enable --system` and run by the real systemd."""

import json

from prometheus_client.parser import text_string_to_metric_families

from .harness import NGPUS

POLICY = "/etc/dbus-1/system.d/org.resourced.conf"


def _doctor(ns, *args, user=None):
    done = ns.gpuctl("doctor", "--bus", "system", "--json", *args, user=user, check=False,
                     timeout=60)
    return done, {c["id"]: c for c in json.loads(done.stdout)["checks"]}


def test_doctor_finds_the_service_as_enable_installed_it(service):
    done, checks = _doctor(service.ns)
    assert done.returncode == 0, done.stdout
    assert checks["service"]["status"] == "ok", checks["service"]
    assert checks["service"]["detail"]["modes"] == ["system"]
    assert checks["service"]["detail"]["active"] == {"system": "active"}
    assert checks["config"]["status"] == "ok" and "/etc/resourced/config.toml" in checks[
        "config"]["summary"]
    for name, path in (("runtime", "/run/resourced"), ("state", "/var/lib/resourced")):
        found = checks[f"daemon.{name}-dir"]
        assert found["status"] == "ok", found
        assert found["detail"]["path"] == path and found["detail"]["owner"] == "resourced"
    assert checks["daemon.gpus"]["detail"]["managed"] == NGPUS


def test_a_changed_bus_policy_is_named_with_the_fix(service):
    ns = service.ns
    original = ns.run("cat", POLICY).stdout
    ns.write(POLICY, original.replace("<policy", "<!-- edited -->\n<policy", 1))
    try:
        done, checks = _doctor(ns)
        assert done.returncode == 0  # a warning
        assert checks["service"]["status"] == "warn"
        assert POLICY in checks["service"]["summary"]
        assert "gpuctl service enable --system" in checks["service"]["fix"]
        assert _doctor(ns, "--strict")[0].returncode == 13
    finally:
        ns.write(POLICY, original)


def test_a_member_of_the_access_group_reads_doctor_and_metrics(service, owner):
    ns = service.ns
    ref = service.claim("alice", owner("alice"))
    assert ref
    done, checks = _doctor(ns, user=service.login("alice"))
    assert checks["bus"]["status"] == "ok" and checks["daemon.state-dir"]["status"] == "ok"
    text = ns.gpuctl("metrics", "--bus", "system", user=service.login("alice")).stdout
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}
    assert found[("resourced_gpus_free", ())] == NGPUS - 1
    assert found[("resourced_claimed_gpus", (("mode", "dev"),
                                             ("user", service.login("alice"))))] == 1
    info = [labels for name, labels in found if name == "resourced_info"]
    assert len(info) == 1 and dict(info[0])["mode"] == "system"
