"""gpuctl status as text stays readable with thousands of claims: it names a few and
counts the rest (--json and gpuctl queue give them all)."""

from resourced.cli.status import MAX_HOLDERS, MAX_WAITERS, render_status


def claim(i: int, state: str) -> dict:
    return {"id": f"c{i:06d}", "state": state, "user": "ada", "pools": {"slots": 1},
            "priority": 0, "created_usec": 0, "gpus_requested": 0, "vram_bytes": 0,
            "task_name": "", "label": ""}


def status(holders: int, waiters: int) -> dict:
    claims = [claim(i, "granted") for i in range(holders)]
    claims += [claim(holders + i, "queued") for i in range(waiters)]
    return {"gpus": [], "free": 0, "backend": "simulated", "backend_note": "",
            "pools": [{"name": "slots", "unit": "count", "capacity": holders, "free": 0}],
            "claims": claims, "queue": [c["id"] for c in claims[holders:]]}


def test_a_few_holders_and_waiters_are_all_shown():
    text = render_status(status(MAX_HOLDERS, MAX_WAITERS), now=0)
    assert "more" not in text
    assert f"c{MAX_HOLDERS - 1:06d} (ada: 1)" in text
    assert f"c{MAX_HOLDERS + MAX_WAITERS - 1:06d}" in text


def test_thousands_are_named_up_to_a_few_and_counted():
    text = render_status(status(10_000, 2_000), now=0)
    assert f"and {10_000 - MAX_HOLDERS} more" in text
    assert f"... and {2_000 - MAX_WAITERS} more waiting (gpuctl queue lists them all)" in text
    assert len(text.splitlines()) < 40
    assert max(len(line) for line in text.splitlines()) < 200


def test_columns_stay_aligned_with_wide_characters():
    """A label in CJK or with an emoji takes two cells a character on a terminal."""
    from resourced.cli.status import cells, table

    rows = [("LABEL", "GPU"), ("训练", "gpu0"), ("🚀 run", "gpu1"), ("plain", "gpu2"),
            ("café", "gpu3")]
    lines = table(rows)
    starts = {cells(line[:line.index("gpu")]) for line in lines[1:]}
    assert starts == {cells("🚀 run") + 2}, lines  # one column start for every row
    assert (cells("训练"), cells("🚀"), cells("cafe\u0301")) == (4, 2, 4)
