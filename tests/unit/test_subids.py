"""A rootless container's uid is the user's whose /etc/subuid range holds it."""

import pwd

from resourced.evidence.subids import owner_of, ranges

ME = pwd.getpwuid(0).pw_name


def test_a_uid_in_one_users_range_is_that_users(tmp_path):
    subuid = tmp_path / "subuid"
    subuid.write_text(f"{ME}:100000:65536\n1234:200000:65536\nnobody-here:300000:10\n"
                      "broken line\n")
    table = ranges(str(subuid))
    assert table == [(100000, 65536, 0), (200000, 65536, 1234)]  # unknown names left out
    assert owner_of(100000, table) == 0 and owner_of(165535, table) == 0
    assert owner_of(165536, table) == 165536  # past the range: itself
    assert owner_of(200005, table) == 1234
    assert owner_of(1000, table) == 1000


def test_overlapping_ranges_of_two_users_name_nobody(tmp_path):
    subuid = tmp_path / "subuid"
    subuid.write_text(f"{ME}:100000:100\n1234:100050:100\n")
    table = ranges(str(subuid))
    assert owner_of(100010, table) == 0
    assert owner_of(100060, table) == 100060  # both ranges: not for certain
    assert ranges(str(tmp_path / "missing")) == []
