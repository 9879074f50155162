"""The Prometheus text format, as prometheus_client's own parser reads it back."""

import math

from prometheus_client.parser import text_string_to_metric_families

from resourced.core.exposition import COUNTER, GAUGE, Family, render


def parsed(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_families_read_back_with_their_kind_help_labels_and_values():
    text = render([
        Family("resourced_gpus", GAUGE, "GPUs by state.").add(3, state="free").add(1, state="claimed"),
        Family("resourced_requests_total", COUNTER, "Calls.").add(7, method="Claim"),
        Family("resourced_queue_oldest_wait_seconds", GAUGE, "Wait.").add(1.25),
    ])
    families = parsed(text)
    gpus = families["resourced_gpus"]
    assert gpus.type == "gauge" and gpus.documentation == "GPUs by state."
    assert {s.labels["state"]: s.value for s in gpus.samples} == {"free": 3, "claimed": 1}
    calls = families["resourced_requests"]  # the parser names a counter without _total
    assert calls.type == "counter"
    assert [(s.name, s.labels, s.value) for s in calls.samples] == [
        ("resourced_requests_total", {"method": "Claim"}, 7)]
    assert families["resourced_queue_oldest_wait_seconds"].samples[0].value == 1.25
    assert text.endswith("\n")


def test_label_values_and_help_are_escaped():
    awkward = 'a "quoted"\\back\nslash'
    text = render([Family("resourced_claims", GAUGE, "Help with \\ and\nnewline.").add(
        1, user=awkward)])
    family = parsed(text)["resourced_claims"]
    assert family.samples[0].labels["user"] == awkward
    assert family.documentation == "Help with \\ and\nnewline."
    assert len(text.splitlines()) == 3  # the newlines were escaped, not written


def test_special_values_and_empty_families():
    text = render([Family("resourced_x", GAUGE, "x.").add(float("nan")).add(float("inf"), k="i"),
                   Family("resourced_none", GAUGE, "nothing yet.")])
    families = parsed(text)
    values = [s.value for s in families["resourced_x"].samples]
    assert math.isnan(values[0]) and values[1] == math.inf
    assert families["resourced_none"].samples == []
    assert render([Family("resourced_up", GAUGE, "x.").add(True)]).endswith("resourced_up 1\n")
