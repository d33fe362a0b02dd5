"""Child processes end when their parent does, even if the parent is killed with SIGKILL, and leave
Ctrl-C to their parent."""
import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def exit_with_parent(poll_s: float = 1.0, handle_signals: bool = True) -> None:
    """handle_signals False: SIGTERM and SIGINT stay the process's own (a model's HTTP server drains on them)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if handle_signals:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        # Ctrl-C reaches the whole process group; the parent decides how to stop, children follow its Shutdown.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:  # also covers platforms without PDEATHSIG
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()
