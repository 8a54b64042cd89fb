"""Errors of the search layer that reach the user."""


class UserError(Exception):
    """Bad input: printed as one line `paxsearch: error: ...` with exit status 2."""
