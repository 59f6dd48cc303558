"""Progress of an import or export on stderr: :class:`blocklab.progress.Progress` (shared with
the probe runner), re-exported where the converters have always imported it."""

from blocklab.progress import Progress, quiet

__all__ = ["Progress", "quiet"]
