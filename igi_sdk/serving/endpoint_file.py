"""``serve --endpoint-file``: the sidecar's endpoint, one line in a file a launcher reads (the
port of ``tcp://127.0.0.1:0`` is known only once bound), written and removed without trusting
what another local program may have put at that path."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write(path: Path, endpoint: str) -> None:
    """The endpoint as one line, atomically: a reader sees no file or the whole line. Written
    to a file created here, exclusively, under an unpredictable name (never one another program
    planted: a link there was followed and its target overwritten), then renamed over ``path``
    (a rename replaces a link at ``path``, never what it points to)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(endpoint + "\n")
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise


# the endpoint file is one line: what is read of it at most
_ENDPOINT_FILE_MAX = 4096


def remove(path: Path, endpoint: str) -> None:
    """Remove ``path`` if it still names this sidecar (a newer one may have written its
    endpoint there since). Only a regular file is read, and at most a line of it: a FIFO or a
    link to a device planted there neither blocks nor bloats the exit."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return  # gone, a link (O_NOFOLLOW), or not ours to read
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        line = os.read(fd, _ENDPOINT_FILE_MAX)
    except OSError:
        return
    finally:
        os.close(fd)
    if line.decode("utf-8", "replace").strip() == endpoint:
        path.unlink(missing_ok=True)
