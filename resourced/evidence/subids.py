"""Whose a rootless container's process is: ``/etc/subuid`` gives each user a range of
uids that only their own user namespaces may map (newuidmap enforces it), so a process
running as uid 100005 on the host is alice's when alice's range holds 100005."""

import pwd

SUBUID = "/etc/subuid"


def ranges(path: str = SUBUID) -> list[tuple[int, int, int]]:
    """(first uid, count, the user's uid) for each line; lines that name nobody known, or
    make no sense, are left out."""
    found = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        try:
            owner = int(parts[0]) if parts[0].isdigit() else pwd.getpwnam(parts[0]).pw_uid
        except KeyError:
            continue
        found.append((int(parts[1]), int(parts[2]), owner))
    return found


def owner_of(uid: int, table: list[tuple[int, int, int]]) -> int:
    """The user whose subordinate range holds ``uid``: ``uid`` itself when none does, or
    when ranges of different users overlap there (then nobody is named for certain)."""
    owners = {owner for first, count, owner in table if first <= uid < first + count}
    return owners.pop() if len(owners) == 1 else uid
