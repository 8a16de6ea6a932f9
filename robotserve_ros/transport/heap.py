"""Large frame buffers go back to the OS when freed (glibc only; elsewhere nothing is done).

glibc serves a block of at least M_MMAP_THRESHOLD with its own mmap, returned on free, but it
raises that threshold to the size of each such block freed (up to 32 MiB): after the first
15 MB websocket frame is freed, the next ones come from the heap and its arenas, which keep
the pages after a burst (an openpi server stayed at its 640-860 MB peak after its
connections closed). A fixed threshold turns that adjustment off (mallopt(3)); `trim()`
returns what the arenas hold free (malloc_trim(3))."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import threading

log = logging.getLogger("robotserve.heap")
M_MMAP_THRESHOLD = -3  # <malloc.h>
FRAME_MMAP_THRESHOLD = 1 << 20  # blocks of 1 MiB and more: a frame, never a small object
_lock = threading.Lock()
_libc = None
_set = False


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if platform.libc_ver()[0] == "glibc":
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            except OSError:
                pass
    return _libc or None


def return_large_frees(threshold: int = FRAME_MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (once per process); True when set."""
    global _set
    with _lock:
        libc = _glibc()
        if libc is None:
            return False
        if not _set:
            _set = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
            log.debug("mallopt(M_MMAP_THRESHOLD, %d): %s", threshold, _set)
        return _set


def trim() -> bool:
    """Give the free pages of every arena back to the OS; True if some were."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
