"""Safe file handling shared by every artifact: sanitized names and atomic writes."""
import os
import re
import tempfile

from .errors import GCacheError

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
            f"The {what} {name!r} cannot be used as a file name: use letters, digits, '.', '_', '-' or spaces "
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


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
