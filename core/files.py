"""Safe file handling shared by every artifact: sanitized names and atomic writes."""
import contextlib
import os
import re
import tempfile
import time
from typing import Optional

from .errors import GCacheError
from .user_text import quoted

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")


def safe_name(name: str, what: str = "name") -> str:
    """Return `name` if it is usable as a single file name, else raise.

    We refuse instead of silently rewriting: a user who typed "../x" should learn that it is not a name.
    """
    if not isinstance(name, str) or not name.strip():
        raise GCacheError(f"The {what} is empty: type a short name such as 'flux_dev_30steps'.")
    name = name.strip()
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name or not _SAFE_NAME.match(name):
        raise GCacheError(
            f"The {what} {quoted(name)} cannot be used as a file name: use letters, digits, '.', '_', '-' or spaces "
            "(no path separators, no '..', at most 128 characters)."
        )
    return name


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write via a temp file in the same folder + rename, so a crash never leaves a half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; users expect the mode of their other files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _file_mode(path: str) -> int:
    """The existing file's mode, else 0666 minus the process umask (read without changing it)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        pass
    umask = 0o022
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o666 & ~umask


def unwritable(folder: str) -> Optional[str]:
    """Why no file can be written in `folder` (None when one can), found the way every save writes: a temporary
    file in that folder (atomic_write_bytes), created and removed at once. The folder is made if it is missing."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return e.strerror or str(e)  # the strerror alone: an OSError's text repeats a temporary file's path
    return None


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def exclusive(path: str, timeout_s: float = 120.0):
    """Hold an advisory lock on `path` (its lock file `.<name>.lock` beside it) for a read-modify-write: two
    ComfyUI processes sharing a models folder would otherwise both read the old file and the later write would
    drop the other's change. The lock is the OS's (flock / msvcrt), so it is released when a process dies."""
    folder, base = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    lock_path = os.path.join(folder, f".{base}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: a read-only descriptor can hold the lock as well
        fd = os.open(lock_path, os.O_RDONLY)
    try:
        if os.name == "nt":
            import errno
            import msvcrt
            lock = lambda: msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # noqa: E731
            unlock = lambda: msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # noqa: E731
            busy = lambda e: e.errno in (errno.EACCES, errno.EDEADLOCK)  # noqa: E731
        else:
            import fcntl
            lock = lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # noqa: E731
            unlock = lambda: fcntl.flock(fd, fcntl.LOCK_UN)  # noqa: E731
            busy = lambda e: isinstance(e, BlockingIOError)  # noqa: E731
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                lock()
                break
            except OSError as e:
                if not busy(e):  # a folder without locks (some network mounts): say so rather than wait
                    raise GCacheError(f"Can't lock {base} in {folder} ({e}); it was not changed.") from None
                if time.monotonic() > deadline:
                    raise GCacheError(f"{base} stayed locked by another process for {timeout_s:.0f} s; it was not "
                                      "changed. Run again when the other GCache run has finished.") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            unlock()
    finally:
        os.close(fd)
