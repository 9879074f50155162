import pytest
from hypothesis import given
from hypothesis import strategies as st

from resourced.protocol.amounts import UNITS, format_bytes, parse_amount, parse_memory

K, M, G, T, P = (UNITS[u] for u in "KMGTP")


@pytest.mark.parametrize(
    "text, value",
    [
        ("4096", 4096),
        ("1", 1),
        ("64G", 64 * G),
        ("512M", 512 * M),
        ("1.5T", 3 * T // 2),
        ("2P", 2 * P),
        ("8K", 8 * K),
        ("4GiB", 4 * G),
        ("4GB", 4 * G),
        ("4Gi", 4 * G),
        ("4g", 4 * G),
        ("4gib", 4 * G),
        (" 4 G ", 4 * G),
        ("512B", 512),
        (".5K", 512),
        ("1.K", 1024),
        ("1.3K", 1331),  # 1331.2, rounded down
        ("2.9", 2),  # a fractional count rounds down too
        ("1.0000000001G", G + 0),  # 1073741824.107...: the fraction is dropped
        ("1048576K", G),
    ],
)
def test_parse_amount(text, value):
    assert parse_amount(text) == value


def test_parse_amount_takes_whole_numbers():
    assert parse_amount(5) == 5
    assert parse_amount(0, allow_zero=True) == 0


@pytest.mark.parametrize(
    "text",
    ["", " ", "G", "abc", "4X", "4 GG", "4iB", "4KiBB", "1e9", "1_000", "0x10", "4.5.6",
     "four", "NaN", "inf", "4 G B", "+4", "--4", "4,5"],
)
def test_parse_amount_rejects_garbage(text):
    with pytest.raises(ValueError, match="not an amount"):
        parse_amount(text)


@pytest.mark.parametrize("text", ["-1", "-4G", " -0.5T", -3])
def test_parse_amount_rejects_negatives(text):
    with pytest.raises(ValueError, match="negative"):
        parse_amount(text)


@pytest.mark.parametrize("text", ["0", "0G", "0.0", "0.4", 0])
def test_zero_only_where_the_caller_allows_it(text):
    with pytest.raises(ValueError, match="greater than 0"):
        parse_amount(text)
    assert parse_amount(text, allow_zero=True) == 0


@pytest.mark.parametrize("value", [True, False, 1.5, None, [], b"4G"])
def test_parse_amount_rejects_other_types(value):
    with pytest.raises(ValueError):
        parse_amount(value)


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0"),
        (1, "1"),
        (1023, "1023"),
        (1024, "1K"),
        (1536, "1.5K"),
        (4 * G, "4G"),
        (3 * T // 2, "1.5T"),
        (5 * G // 4, "1.25G"),
        (1331, "1.29K"),  # 1.2998: rounded down, never shown as more than there is
        (G - 1, "1023.99M"),
        (64 * G, "64G"),
        (2048 * P, "2048P"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("value", [-1, 1.5, True, "4G", None])
def test_format_bytes_rejects_non_amounts(value):
    with pytest.raises(ValueError):
        format_bytes(value)


@given(st.integers(min_value=4, max_value=4 * 1024 - 1), st.sampled_from([K, M, G, T, P]))
def test_format_then_parse_is_the_identity_for_exact_figures(quarters, unit):
    n = quarters * unit // 4  # from 1 to 1023.75 units, in quarters
    assert parse_amount(format_bytes(n)) == n


@given(st.integers(min_value=1, max_value=1023))
def test_small_counts_are_plain_numbers(n):
    assert format_bytes(n) == str(n)
    assert parse_amount(format_bytes(n)) == n


@given(st.integers(min_value=1, max_value=100 * P))
def test_format_never_shows_more_than_there_is(n):
    shown = parse_amount(format_bytes(n))
    assert shown <= n
    assert shown * 100 >= n * 99 - 100  # within 1% (and the byte a fraction loses)


@pytest.mark.parametrize("text, said", [
    ("1e30G", "expected a number and a unit K, M, G, T or P, like '24G' or '512M'"),
    ("99999999P", "too large: '99999999P' (at most 8191P)"),
])
def test_memory_refusals_suggest_only_what_memory_takes(text, said):
    """--vram refuses a bare number: its refusals never suggest one."""
    with pytest.raises(ValueError) as refused:
        parse_memory(text)
    assert said in str(refused.value) and "'4096'" not in str(refused.value)
