"""A few rounds of chaos: the daemon SIGKILLed at a random instant of a burst of claims
and releases from several clients, then restarted.  benchmarks/chaos.py runs many more."""

from benchmarks.chaos import run


def test_kill_9_at_random_instants_of_bursts_loses_nothing_and_doubles_nothing(tmp_path):
    figures = run(rounds=4, clients=4, gpus=4, workdir=tmp_path)
    report = "\n".join([f"seed {figures.seed}: {figures.line()} (logs in {tmp_path})",
                        *figures.problems])
    assert figures.rounds == 4 and figures.acknowledged > 0, report
    assert not figures.problems, report  # lost, doubled, unreadable, revived, client failures
