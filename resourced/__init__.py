"""resourced: a cooperative GPU and resource allocator for one shared Linux machine.

``from resourced import Client`` is all most programs need; the names load lazily so that
``import resourced`` stays cheap for the command line.
"""

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "ResourcedError", "__version__"]


def __getattr__(name):
    if name in ("Client", "AsyncClient"):
        from . import client

        return getattr(client, name)
    if name == "ResourcedError":
        from resourced.errors import ResourcedError

        return ResourcedError
    raise AttributeError(f"module 'resourced' has no attribute {name!r}")
