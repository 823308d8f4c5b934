"""LPIPS's backbone, fetched the way torchvision would fetch it, where a user expects it: on first use.

torchvision's ImageNet AlexNet (`alexnet-owt-7be5be79.pth`, 233 MB) comes from the address torchvision itself
uses into torch.hub's checkpoint folder, with a log line and a progress bar, through a temporary file that only
becomes the real one after its sha256 checks out (torchvision's convention: the file name carries the first
8 hex digits of the hash). Offline or blocked: a clear message (the caller adds what to do), nothing left behind.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Callable, Optional

log = logging.getLogger("gcache")
ALEXNET_URL = "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"
TIMEOUT_S = 30  # per read: a blocked network fails in seconds, not after the OS's minutes


class DownloadFailed(Exception):
    """Why the file could not be had (offline, blocked, refused, or not the expected file)."""


def download_checked(url: str, path: str, sha256_prefix: str, opener: Optional[Callable] = None) -> str:
    """Fetch `url` to `path` unless the content's sha256 does not start with `sha256_prefix`."""
    opener = opener or urllib.request.urlopen
    folder = os.path.dirname(os.path.abspath(path))
    log.info("GCache: downloading %s to %s (first use of LPIPS; once only).", url, path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gcache-download-", dir=folder)
    except OSError as e:
        raise DownloadFailed(f"{folder} cannot be written ({e})") from None
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                response = opener(url, timeout=TIMEOUT_S)
            except (urllib.error.URLError, OSError) as e:
                raise DownloadFailed(f"the download from {url} failed ({e}); this machine seems to be offline or "
                                     "the address is blocked") from None
            with response:
                total = int(response.headers.get("Content-Length") or 0) or None
                bar = _progress(total, os.path.basename(path))
                try:
                    while chunk := response.read(1 << 20):
                        f.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
                except (urllib.error.URLError, OSError) as e:
                    raise DownloadFailed(f"the download from {url} broke off ({e})") from None
                finally:
                    bar.close()
        got = digest.hexdigest()
        if not got.startswith(sha256_prefix):
            raise DownloadFailed(f"the file from {url} has sha256 {got[:16]}…, not {sha256_prefix}…; it was not kept")
        os.replace(tmp, path)
        log.info("GCache: %s downloaded, sha256 %s… checked.", os.path.basename(path), got[:16])
        return path
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _progress(total, name):
    try:
        from tqdm import tqdm  # lpips depends on it
        return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr)
    except ImportError:  # pragma: no cover - a progress bar is a nicety
        class _Quiet:
            def update(self, n): ...
            def close(self): ...
        return _Quiet()
