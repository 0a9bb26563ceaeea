"""The sidecar's log file: rotating and bounded, so a long-running install never fills a disk."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 3  # sidecar.log plus .1 .. .3: at most 20 MiB
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class SidecarLogHandler(logging.handlers.RotatingFileHandler):
    """The handler :func:`configure_logging` installs (its own type, so that configuring twice
    replaces it instead of writing every line twice)."""


def configure_logging(path: Path, level: int = logging.INFO, max_bytes: int = MAX_BYTES,
                      backups: int = BACKUPS) -> SidecarLogHandler:
    """Log the whole process (the root logger) to ``path`` too, rotated at ``max_bytes`` with
    ``backups`` older files kept. Other handlers (the console's) stay."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, SidecarLogHandler)]:
        root.removeHandler(old)
        old.close()
    handler = SidecarLogHandler(path, maxBytes=max_bytes, backupCount=backups,
                                encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(level)
    root.addHandler(handler)
    if root.level > level:  # NOTSET (0) passes everything already
        root.setLevel(level)
    return handler
