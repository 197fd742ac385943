"""The one exception family aiayn raises for bad input.

Every error a user can cause (a bad config value, a corrupt checkpoint, a malformed corpus,
a token id outside the vocabulary) is an `AiaynError`. The CLI prints its message as one line
and exits non-zero; anything else is a bug and keeps its traceback.
`AiaynError` subclasses `ValueError` so library callers can catch the familiar type.
"""


class AiaynError(ValueError):
    """Bad input, explained in one line."""


class ConfigError(AiaynError):
    """A config file, preset name or `--set` override that does not fit the dataclasses."""


class CheckpointError(AiaynError):
    """A model directory that is missing, corrupt, foreign, or does not fit its config."""


class DataError(AiaynError):
    """A corpus file that cannot be used as it is (mismatched lines, invalid UTF-8, empty)."""
