"""Progress on stderr, so a log never sits silent through a minute of work (an import or
export reading, dequantizing and writing; a probe grid scoring its batches): one line per stage
(``import: reading ...``), and for the long loops a tqdm bar on a terminal or, in a log, a plain
line at the start, at most every ``every`` seconds, and at the end. stdout keeps the result
(notes, what was written, the probe report)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO


class Progress:
    """Stage lines ``<prefix>: <message>`` and counted loops (:meth:`count`) on ``stream``
    (stderr by default, looked up when written, so a redirected stderr is followed)."""

    def __init__(self, prefix: str, *, stream: IO[str] | None = None, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix, self.every, self.clock = prefix, every, clock
        self._stream = stream

    @property
    def stream(self) -> IO[str]:
        return self._stream if self._stream is not None else sys.stderr

    def __call__(self, message: str) -> None:
        print(f"{self.prefix}: {message}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def count(self, what: str, total: int) -> Iterator[Callable[[], None]]:
        """A loop of ``total`` steps: call the yielded function once per step."""
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            from tqdm.auto import tqdm

            with tqdm(total=total, desc=f"{self.prefix}: {what}", file=self.stream) as bar:
                yield lambda: bar.update(1)
            return
        done, last = 0, self.clock()
        start = last
        self(f"{what} 0/{total}")

        def tick() -> None:
            nonlocal done, last
            done += 1
            if done < total and self.clock() - last >= self.every:
                last = self.clock()
                left = (last - start) / done * (total - done)
                self(f"{what} {done}/{total} ({100 * done // max(total, 1)}%, about "
                     f"{duration(left)} left)")

        yield tick
        self(f"{what} {done}/{total} ({100 * done // max(total, 1)}%)")


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 2 min``: a time a reader takes in at a glance."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def quiet() -> Progress:
    """A :class:`Progress` that writes nothing (in-memory reads)."""
    return _Quiet("")


class _Quiet(Progress):
    def __call__(self, message: str) -> None:
        pass

    @contextlib.contextmanager
    def count(self, what: str, total: int) -> Iterator[Callable[[], None]]:
        yield lambda: None
