"""Giving the memory the daemon freed back to the system, where the C library can."""

import ctypes
import functools

BIG = 1 << 20
"""Bytes: an answer this long leaves enough freed behind it to be worth a trim."""


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except AttributeError:  # not glibc
        return None


def trim() -> None:
    """Return the free memory at the top of the C heap to the kernel (glibc's
    ``malloc_trim``; nothing elsewhere).  A restore of 10,000 claims, or a 4 MB answer,
    frees megabytes that glibc would otherwise keep for later."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
