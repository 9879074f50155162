"""The Python client: ``Client`` (blocking), ``AsyncClient`` (asyncio) and their leases.

The names load lazily, so that the light modules here (``discovery``, ``environment``)
cost a command nothing they do not use, and a blocking client never loads asyncio.
"""

__all__ = ["AsyncClient", "AsyncLease", "Client", "Lease", "SharedClient"]


def __getattr__(name):
    if name in ("AsyncClient", "AsyncLease"):
        from . import aio

        return getattr(aio, name)
    if name in __all__:
        from . import sync

        return getattr(sync, name)
    raise AttributeError(f"module 'resourced.client' has no attribute {name!r}")
