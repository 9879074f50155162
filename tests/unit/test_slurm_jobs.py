"""Slurm jobs as claims: the pure parts (GPUs from a job's environment, step titles, the
[slurm] config) and the ledger's side (a job's claim; Slurm's GPUs kept from ours)."""

import pytest

from resourced.config import ConfigError, SlurmConfig, parse_config, reload_changes
from resourced.core.attribution import ProcInfo
from resourced.core.claims import SLURM, ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import ClaimGranted, ClaimReleased, Ledger
from resourced.daemon.engine.slurm_jobs import job_label, job_steps, slurm_gpus, step_job
from resourced.errors import NotEnoughGPUs
from resourced.slurm.hooks import job_gpus

GPUS = [Gpu(i, f"GPU-{i}", "sim", 80 << 30, f"0000:0{i}:00.0", "big" if i == 3 else "")
        for i in range(4)]


def test_job_gpus_come_from_the_first_variable_set():
    assert job_gpus({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["2", "3"]
    assert job_gpus({"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}) == ["1"]
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"}) == ["GPU-a", "GPU-b"]
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert job_gpus({}) == []


def test_label_and_step_titles():
    assert job_label("1234", "alice", "train.sh") == "slurm 1234 alice train.sh"
    assert job_label("7", "bob", "") == "slurm 7 bob"
    assert step_job(b"slurmstepd: [1234.0]\0\0") == "1234"
    assert step_job(b"slurmstepd: [88.batch]") == "88"
    assert step_job(b"slurmstepd: [88.extern]") == "88"
    assert step_job(b"/usr/sbin/slurmstepd\0") is None
    assert step_job(b"sleep\0slurmstepd: [1.0]") is None


def test_job_steps_read_titles_of_roots_slurmstepd_processes_only():
    table = {1: ProcInfo(1, 0, 5, uid=0, name="systemd"),
             10: ProcInfo(10, 1, 50, uid=0, name="slurmstepd"),
             11: ProcInfo(11, 1, 51, uid=0, name="slurmstepd"),
             12: ProcInfo(12, 10, 52, uid=1000, name="sleep"),
             13: ProcInfo(13, 1, 53, uid=1000, name="slurmstepd")}  # a user's impostor
    titles = {10: b"slurmstepd: [5.0]", 11: b"slurmstepd: [5.extern]", 13: b"slurmstepd: [5.0]"}
    read = []
    steps = job_steps(table, lambda pid: read.append(pid) or titles.get(pid, b""))
    assert steps == {"5": {ProcessRef(10, 50), ProcessRef(11, 51)}}
    assert sorted(read) == [10, 11]


def test_slurm_gpus_by_name_or_all():
    assert slurm_gpus("all", GPUS) == (frozenset(g.uuid for g in GPUS), [])
    assert slurm_gpus(("gpu1", "2", "big", "gpu-0", "nope"), GPUS) == (
        frozenset({"GPU-0", "GPU-1", "GPU-2", "GPU-3"}), ["nope"])
    assert slurm_gpus((), GPUS) == (frozenset(), [])


def test_config_section():
    assert parse_config("", "f").slurm == SlurmConfig()
    assert parse_config('[slurm]\ngpus = "all"\n', "f").slurm.gpus == "all"
    assert parse_config('[slurm]\ngpus = ["gpu2", 3]\n', "f").slurm.gpus == ("gpu2", "3")
    for text, problem in (('[slurm]\ngpus = "some"\n', "slurm.gpus: must be"),
                          ("[slurm]\ngpu = []\n", "did you mean gpus?"),
                          ("slurm = 1\n", "slurm: must be a table")):
        with pytest.raises(ConfigError, match=problem):
            parse_config(text, "f")
    old, new = parse_config("", "f"), parse_config('[slurm]\ngpus = "all"\n', "f")
    assert reload_changes(old, new) == ([], ["slurm"])


def ledger() -> Ledger:
    return Ledger(GPUS, slurm=frozenset({"GPU-2", "GPU-3"}))


def dev(n: int) -> ClaimRequest:
    return ClaimRequest(Demand(n), "dev", ProcessRef(100, 1), uid=1000)


def test_our_claims_and_bookings_never_get_slurms_gpus():
    led = ledger()
    assert [g.uuid for g in led.free_gpus()] == ["GPU-0", "GPU-1"]
    assert set(led.timeline.memory) == {"GPU-0", "GPU-1"}
    with pytest.raises(NotEnoughGPUs, match="the machine has 2 besides the 2 Slurm schedules"):
        led.submit(dev(3), "c1", 0)
    _, refusal = led.submit(dev(2), "c1", 0)
    assert refusal is None and led.claims["c1"].gpus == ("GPU-0", "GPU-1")
    _, refusal = led.submit(dev(1), "c2", 0)
    assert isinstance(refusal, NotEnoughGPUs)
    led.check_invariants()


def test_a_jobs_claim_is_granted_at_once_and_ends_with_its_last_process():
    led = ledger()
    [granted] = led.start_job("j1", "77", ("GPU-2", "GPU-3"), 1000, "alice", "slurm 77 alice", 5)
    assert isinstance(granted, ClaimGranted)
    claim = led.claims["j1"]
    assert (claim.mode, claim.job, claim.gpus, claim.owner_alive) == (
        SLURM, "77", ("GPU-2", "GPU-3"), False)
    assert led.counts_of(1000) == (0, 0, 0)  # Slurm's limits, not ours
    led.check_invariants()
    step, task = ProcessRef(10, 1), ProcessRef(11, 2)
    led.add_members("j1", [step, task])
    assert led.member_exited("j1", task)[0].claim.members == {step}
    [released] = led.member_exited("j1", step)
    assert isinstance(released, ClaimReleased) and released.reason == "job-ended"
    assert led.claims == {}
    led.check_invariants()


def test_a_job_on_a_gpu_we_hold_is_refused():
    led = ledger()
    led.submit(dev(1), "c1", 0)
    with pytest.raises(NotEnoughGPUs, match="claim.s. c1 hold"):
        led.start_job("j1", "78", ("GPU-0",), 1000, "alice", "slurm 78 alice", 5)
    assert set(led.claims) == {"c1"}
    led.check_invariants()
