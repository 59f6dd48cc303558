"""Errors a user can cause and fix, each with the exit code the command line reports (the lowest
floor: every other module may raise them), and the standard output every command writes
through (:func:`standard_output`: a full disk is one line, a reader that went away a quiet
exit)."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


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


class ResourceError(StorageError):
    """Memory ran out where a setting asked for it (exit code 6, as I/O: what the machine
    lacks, not what the config breaks). Raised as ``ResourceError(errno.ENOMEM, one-line
    message)``, the message naming the setting (``max_new_tokens=...``)."""


class NumericalError(FloatingPointError):
    """Non-finite numbers where a command needs finite ones (exit code 5): the one-line message
    names the checkpoint and where it happened."""

    exit_code = 5


# ------------------------------------------------------------------------ standard output

#: The exit status of a command whose standard output was closed by its reader (``| head``):
#: 128 + SIGPIPE, what a shell reports for a Unix tool that SIGPIPE ended (``yes | head``).
OUTPUT_CLOSED = 141


class OutputClosed(BaseException):
    """Standard output's reader went away: the command stops, as SIGPIPE stops a Unix tool,
    and exits quietly with :data:`OUTPUT_CLOSED`. A ``BaseException`` (like
    ``KeyboardInterrupt``): no ``except Exception`` on the way reports it as an error or goes
    on writing to nobody."""


class OutputFull(StorageError):
    """Standard output cannot be written: a full disk, another write error (exit code 6)."""


class StandardOutput:
    """``sys.stdout`` while a command runs (:func:`standard_output`): the stream it wraps,
    whose failed writes raise :class:`OutputClosed` (a closed pipe) or :class:`OutputFull`
    (anything else) instead of an ``OSError`` no one can tell from the command's own files."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as e:
            raise self._failure(e) from None

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as e:
            raise self._failure(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _failure(self, e: OSError) -> BaseException:
        self.failed = True
        if e.errno == errno.EPIPE:
            return OutputClosed()
        rule = ("no space left on device" if e.errno == errno.ENOSPC
                else f"cannot write ({e.strerror or e})")
        return OutputFull(e.errno, f"I/O error: standard output: {rule}")


@contextlib.contextmanager
def standard_output() -> Iterator[None]:
    """Run a command (a ``with`` block, or a decorated entry function) with
    :class:`StandardOutput` as ``sys.stdout``: its output is flushed before it returns or
    exits; a reader that went away ends it quietly with :data:`OUTPUT_CLOSED`, and an output
    that cannot be written in one line with exit code 6 (a command that reported it itself
    just exits). Either way the descriptor then points at ``/dev/null``, as Python's
    documentation advises for ``BrokenPipeError``, so that the interpreter's last flush finds
    nothing to complain about ("Exception ignored ... BrokenPipeError")."""
    original = sys.stdout
    if original is None or isinstance(original, StandardOutput):
        yield
        return
    out = sys.stdout = StandardOutput(original)
    code = None
    try:
        try:
            yield
        except SystemExit:
            if not out.failed:
                out.flush()  # what it printed goes first (a failure replaces the exit)
            raise
        out.flush()
    except OutputClosed:
        code = OUTPUT_CLOSED
    except OutputFull as e:
        print(e.args[-1], file=sys.stderr, flush=True)
        code = e.exit_code
    finally:
        sys.stdout = original
        if out.failed:
            _discard(original)
    if code is not None:
        raise SystemExit(code)


def _discard(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at ``/dev/null``: what is left in its buffer goes there."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
