"""Errors a user can cause and fix, each with the exit code the command line reports (the lowest
floor: every other module may raise them)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-fixable config problem (exit code 2): the one-line message names the dotted config
    key, the value and the rule."""

    exit_code = 2


class StorageError(OSError):
    """Writing failed: disk full, an unwritable or unusable path (exit code 6). Raised as
    ``StorageError(errno, one-line message)``."""

    exit_code = 6


class DataError(ValueError):
    """Missing, empty or malformed data (exit code 3): the one-line message names the file
    (and where in it) or the data config key."""

    exit_code = 3


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, unsafe or incompatible, or a resume is refused (exit
    code 4). Defined here (re-exported as ``checkpoint.CheckpointError``) so that checking a
    stored config — torch-free, in ``config`` — can raise it."""

    exit_code = 4
