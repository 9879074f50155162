"""Accounts by uid, as the user database names them."""

import pwd


def user_name(uid: int) -> str:
    """The account's name, else its uid as text (an account the database does not know)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
