"""Writing files so that readers never see half of one, and reading small files wholly into memory.

``save_atomic`` writes to a temporary file in the destination's folder and renames it into place
(``os.replace``, atomic on POSIX and Windows within one file system). A process that still maps or
reads the old file keeps its old contents (the old inode lives until it is closed); an interrupted
write leaves the destination as it was and removes the temporary file (a killed process leaves the
temporary file, never a truncated destination).

``read_bytes_to_memory`` reads a file into an in-memory buffer and closes it, so nothing refers to the
file afterwards: saving another file over it cannot change or break what was read.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile

import torch

__all__ = ["save_atomic", "read_bytes_to_memory", "regular_file_size"]


def _umask() -> int:
    """The process's umask without changing it (Linux reports it in /proc; 0o022 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def save_atomic(obj, path: str | os.PathLike) -> str:
    """``torch.save(obj, path)`` through a temporary file in ``path``'s folder and a rename.

    The new file gets the permissions a plain ``open(path, "w")`` would give it (0o666 less the
    umask), not mkstemp's 0o600. Returns ``path`` as a string."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def regular_file_size(path: str) -> int | None:
    """The size of ``path`` when it is (or links to) a regular file; None for anything else (a
    device such as /dev/zero, a FIFO, a socket), which could be read without end or block."""
    st = os.stat(path)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_bytes_to_memory(path: str) -> io.BytesIO:
    """The whole file in a BytesIO; the file is closed when this returns."""
    with open(path, "rb") as f:
        return io.BytesIO(f.read())
