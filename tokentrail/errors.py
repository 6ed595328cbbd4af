"""The shell's one error type for people: raised by any command, printed by ``tokentrail.cli`` without a traceback.

Its own module so that commands import it from here, not back from the CLI module that loads them by name.
"""


class CliError(Exception):
    """An error a person can act on; printed without a traceback."""
