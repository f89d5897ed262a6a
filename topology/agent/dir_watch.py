"""Wake the device plugin when its directory changes: inotify on Linux, the poll interval elsewhere.

A restarting kubelet deletes every socket in the device-plugins directory, recreates `kubelet.sock`, and soon
admits the pods it already runs again. A pod whose GPU container has not started yet is rejected for good
(UnexpectedAdmissionError) if our plugin is not registered by then, so the agent must notice at once: a
second of polling was seen to lose that race against a real v1.36 kubelet (tests/e2e). NVIDIA's device
plugin watches the directory with inotify (fsnotify) for the same reason.

Events are only a wake-up: the caller looks at the sockets again whatever woke it, so a lost or merged event
costs at most one poll interval. Without inotify (another OS, or the user's watch limit reached) `wait` just
sleeps, which is the poll the plugin did before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading

log = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_CREATE, _IN_DELETE, _IN_MOVED_FROM, _IN_MOVED_TO = 0x100, 0x200, 0x40, 0x80
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_IGNORED = 0x400, 0x800, 0x8000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_MASK = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_DELETE_SELF | _IN_MOVE_SELF
_STOP_CHECK_SECONDS = 0.2  # how soon `wait` sees `stop` set while no event comes


class DirectoryWatch:
    """`wait(seconds, stop)` returns early when an entry of `path` is created, deleted or moved. A directory
    that is itself removed or replaced is watched again at the next wait where it exists."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = _inotify(path, quiet=False)

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Until a change, `stop`, or `seconds`; what woke it is read and dropped."""
        if self._fd is None and os.path.isdir(self.path):
            self._fd = _inotify(self.path, quiet=True)
        if self._fd is None:
            stop.wait(seconds)
            return
        remaining = seconds
        while remaining > 0 and not stop.is_set():
            step = min(remaining, _STOP_CHECK_SECONDS)
            if select.select([self._fd], [], [], step)[0]:
                if self._drain() & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED):
                    self.close()  # the directory went: watched again once it is back
                return
            remaining -= step

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _drain(self) -> int:
        """Read every pending event; the union of their masks."""
        assert self._fd is not None
        masks = 0
        try:
            while data := os.read(self._fd, 65536):
                offset = 0
                while offset + _EVENT.size <= len(data):
                    _, mask, _, length = _EVENT.unpack_from(data, offset)
                    masks |= mask
                    offset += _EVENT.size + length
        except BlockingIOError:
            pass
        return masks


_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


def _inotify(path: str, quiet: bool) -> int | None:
    """An inotify descriptor watching `path`, or None (said in the log unless `quiet`) where there is none."""
    say = log.debug if quiet else log.warning
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        say("no inotify here: the device plugin polls %s", path)
        return None
    add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        say("inotify_init1: %s; the device plugin polls %s", os.strerror(ctypes.get_errno()), path)
        return None
    if add(fd, os.fsencode(path), _MASK) < 0:
        error = ctypes.get_errno()
        os.close(fd)
        hint = " (fs.inotify.max_user_watches reached)" if error == errno.ENOSPC else ""
        say("watching %s: %s%s; the device plugin polls it", path, os.strerror(error), hint)
        return None
    return fd
