"""A value too large is refused as too large, not as too small or as malformed."""

import pytest

from resourced.client.arguments import span
from resourced.errors import InvalidArgs
from resourced.protocol.amounts import MAX_AMOUNT, parse_count


@pytest.mark.parametrize("value", ["99999999999999999999h", 10.0 ** 30, 2**63 // 10**6])
def test_a_duration_past_the_bus_limit_says_how_long_it_may_be(value):
    with pytest.raises(InvalidArgs, match="must be less than 106,751,991 days"):
        span("duration", value)


@pytest.mark.parametrize("value", [0, -5, "0s"])
def test_a_duration_of_nothing_still_says_more_than_0(value):
    with pytest.raises(InvalidArgs, match="must be more than 0 seconds"):
        span("duration", value)


def test_a_count_past_the_bus_limit_says_its_limit():
    with pytest.raises(ValueError, match=f"--cpu is at most {MAX_AMOUNT}, not '9{{20}}'"):
        parse_count("9" * 20, "--cpu")
    assert parse_count(str(MAX_AMOUNT)) == MAX_AMOUNT
