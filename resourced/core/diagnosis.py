"""The record of one check of ``gpuctl doctor``, the daemon's (``Diagnose``) or gpuctl's.

``id`` is stable (scripts and the README name it), ``status`` one of ``STATUSES``,
``summary`` one line of what was found, ``fix`` the one thing to do ("" when ok), and
``detail`` the figures behind it.
"""

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
STATUSES = (OK, WARN, FAIL, SKIPPED)


def check(id: str, status: str, summary: str, fix: str = "", **detail) -> dict:
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return {"id": id, "status": status, "summary": summary, "fix": fix, "detail": detail}


def passed(checks: list[dict], strict: bool = False) -> bool:
    """Nothing failed (``strict``: nothing warned either)."""
    bad = {FAIL, WARN} if strict else {FAIL}
    return not any(c["status"] in bad for c in checks)
