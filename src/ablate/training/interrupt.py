"""Ctrl-C while runs train: taken between steps, never inside a collective (training.trainer asks it before each
update; a stack of runs shares one, training.stack)."""

from __future__ import annotations

import signal
import threading


class CtrlC:
    """Ctrl-C while a run trains, taken where every rank can stop together: SIGINT only sets `requested`, the step's
    one all-reduce carries it, and every rank raises KeyboardInterrupt before the same step's update, none left
    inside a collective (a KeyboardInterrupt raised inside gloo's or DCP's collectives hung the process here). A
    second Ctrl-C raises at once; one that comes after the last step stops the run as it leaves."""

    def __init__(self):
        self.requested, self._previous = False, None

    def __enter__(self) -> CtrlC:
        self.requested = False
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:  # a process started ignoring Ctrl-C (nohup, `&`) keeps ignoring it
                self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)  # a second Ctrl-C: at once

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self.requested and exc_type is None:
            raise KeyboardInterrupt
