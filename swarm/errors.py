"""The one error type a user can cause; command-line programs turn it into one line on stderr."""


class SwarmError(Exception):
    """Bad input or an unusable environment: a message for the user, not a bug report."""
