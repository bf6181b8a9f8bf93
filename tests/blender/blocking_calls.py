"""The Blender scenarios' check that Blender's main thread never waits: it notes every call that may block a
thread (socket I/O, waits on a condition, a thread or a process, sleeps) made on the main thread while a watched
call (a timer, an operator, a redraw) runs there. A count, so load on the machine cannot change it."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time

MAY_BLOCK = ((socket.socket, ("connect", "accept", "recv", "recv_into", "send", "sendall")),
             (threading.Condition, ("wait",)),  # under Event.wait, Future.result, Queue.get with a wait
             (threading.Thread, ("join",)), (subprocess.Popen, ("wait", "communicate")), (time, ("sleep",)))


class BlockingCalls:
    def __init__(self):
        self.noted: list[dict] = []  # {"call", "in": the watched call, **its tags}
        self._watched: list[dict] = []  # the watched calls running on the main thread, innermost last
        for owner, names in MAY_BLOCK:
            for name in names:
                self._note_calls_of(owner, name)

    @contextlib.contextmanager
    def watch(self, what: str, **tags):
        self._watched.append({"in": what, **tags})
        try:
            yield
        finally:
            self._watched.pop()

    def _note_calls_of(self, owner, name: str) -> None:
        original = getattr(owner, name)

        def noted(*args, **kwargs):
            if self._watched and threading.current_thread() is threading.main_thread():
                self.noted.append({"call": f"{owner.__name__}.{name}", **self._watched[-1]})
            return original(*args, **kwargs)
        setattr(owner, name, noted)
