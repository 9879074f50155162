"""The XDG base directories, as the spec has them: ``$XDG_CONFIG_HOME`` and the others
when absolute (an empty or relative value is ignored), else their defaults under the home
directory. Standard library only: clients read this at every start."""

import os

DEFAULTS = {"XDG_CONFIG_HOME": ".config", "XDG_DATA_HOME": ".local/share",
            "XDG_STATE_HOME": ".local/state"}


def base_dir(variable: str, environ=os.environ) -> str:
    """The base directory ``variable`` names; RuntimeError where neither it nor a home
    directory ($HOME, else the account's) is known."""
    value = environ.get(variable, "")
    if os.path.isabs(value):
        return value
    home = environ.get("HOME") or os.path.expanduser("~")
    if home == "~":  # (what expanduser leaves when the account has no passwd entry)
        raise RuntimeError(f"no home directory for {variable}'s default")
    return os.path.join(home, DEFAULTS[variable])
