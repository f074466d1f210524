"""Errors meant for users: one line, exit code 2, no traceback (unless ``RLX_DEBUG=1``)."""


class UserError(Exception):
    """A mistake in the user's input: the message names the key or file and what is valid."""
