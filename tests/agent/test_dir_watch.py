"""The device-plugins directory watch: a change wakes it at once, nothing else does before its time, and it keeps
working when the directory is replaced or cannot be watched."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from topology.agent import dir_watch
from topology.agent.dir_watch import DirectoryWatch

LONG = 30.0  # a wait that, if not woken, fails the test by its length (never measured)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def _woken_by(watch: DirectoryWatch, change, stop: threading.Event | None = None) -> float:
    """Seconds `watch.wait(LONG)` took while `change` ran on another thread a moment after it began."""
    threading.Timer(0.05, change).start()
    started = time.monotonic()
    watch.wait(LONG, stop or threading.Event())
    return time.monotonic() - started


@linux
@pytest.mark.parametrize("change", ["create", "delete", "rename"])
def test_a_socket_created_deleted_or_renamed_wakes_it(tmp_path: Path, change: str) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    watch = DirectoryWatch(str(tmp_path))
    assert watch.watching
    action = {"create": lambda: (tmp_path / "gpu.sock").write_text(""),
              "delete": lambda: (tmp_path / "kubelet.sock").unlink(),
              "rename": lambda: (tmp_path / "kubelet.sock").rename(tmp_path / "old.sock")}[change]
    assert _woken_by(watch, action) < LONG / 2
    watch.close()


@linux
def test_without_a_change_it_waits_its_time_and_stop_ends_it(tmp_path: Path) -> None:
    watch = DirectoryWatch(str(tmp_path))
    started = time.monotonic()
    watch.wait(0.3, threading.Event())
    assert time.monotonic() - started >= 0.3
    stop = threading.Event()
    assert _woken_by(watch, stop.set, stop) < LONG / 2
    watch.close()


@linux
def test_a_replaced_directory_is_watched_again(tmp_path: Path) -> None:
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    watch = DirectoryWatch(str(directory))
    assert _woken_by(watch, lambda: os.rename(directory, tmp_path / "gone")) < LONG / 2
    assert not watch.watching
    directory.mkdir()
    watch.wait(0.01, threading.Event())  # watched again from here
    assert watch.watching
    assert _woken_by(watch, lambda: (directory / "kubelet.sock").write_text("")) < LONG / 2
    watch.close()


def test_where_it_cannot_watch_it_waits_as_a_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dir_watch, "_inotify", lambda path, quiet: None)
    watch = DirectoryWatch(str(tmp_path))
    assert not watch.watching
    started = time.monotonic()
    watch.wait(0.2, threading.Event())
    assert time.monotonic() - started >= 0.2
    (tmp_path / "gpu.sock").write_text("")  # no watch: nothing wakes it early, and nothing fails
    watch.wait(0.01, threading.Event())


@linux
def test_a_directory_that_does_not_exist_is_polled_until_it_does(tmp_path: Path) -> None:
    directory = tmp_path / "later"
    watch = DirectoryWatch(str(directory))
    assert not watch.watching
    watch.wait(0.01, threading.Event())
    directory.mkdir()
    watch.wait(0.01, threading.Event())
    assert watch.watching
    watch.close()
