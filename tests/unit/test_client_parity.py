"""``Client`` and ``AsyncClient`` have the same public calls with the same parameters, and
so have their leases: each call is defined once, only the I/O differs."""

import inspect

from resourced.client.aio import AsyncClient, AsyncLease
from resourced.client.sync import Client, Lease


def calls(cls) -> dict[str, list[tuple]]:
    """Each public call's parameters (a property is a call without any)."""
    found = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        value = inspect.getattr_static(cls, name)
        if isinstance(value, property):
            found[name] = []
        elif callable(value):
            found[name] = [(p.name, p.kind, p.default)
                           for p in inspect.signature(value).parameters.values()
                           if p.name != "self"]
    return found


def test_both_clients_have_the_same_calls_with_the_same_parameters():
    assert calls(Client) == calls(AsyncClient)


def test_both_leases_have_the_same_calls():
    assert calls(Lease) == calls(AsyncLease)


def test_the_async_calls_are_awaited_and_keep_their_documentation():
    for name in calls(Client):
        if name in ("acquire", "level_changes"):
            continue  # an async with (or await), and an async iterator
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert getattr(AsyncClient, name).__doc__ == getattr(Client, name).__doc__, name
    assert "progress" in inspect.signature(AsyncClient.claim).parameters


def test_the_calls_the_issue_names_are_on_both():
    for name in ("add_blackout", "add_notice", "blackouts", "bookings_json", "claim_job",
                 "notices", "release_job", "remove_blackout", "remove_notice", "report_job",
                 "status_json", "usage", "level_changes", "wait_level_change"):
        assert callable(getattr(Client, name)) and callable(getattr(AsyncClient, name)), name
