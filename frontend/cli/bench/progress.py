"""A one-line progress bar on stderr (redrawn in place on a terminal; one line at the end otherwise)."""
import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", enabled: bool = True, stream=None, width: int = 30):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self.done = self.failed = 0
        self.start = time.perf_counter()
        if self.live:
            self._draw()

    def update(self, success: bool = True) -> None:
        self.done += 1
        self.failed += not success
        if self.live:
            self._draw()

    def _line(self) -> str:
        filled = self.width * self.done // max(self.total, 1)
        failed = f", {self.failed} failed" if self.failed else ""
        return (f"{self.label}[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}{failed} "
                f"{time.perf_counter() - self.start:.1f}s")

    def _draw(self) -> None:
        self.stream.write("\r" + self._line())
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write(("\r" if self.live else "") + self._line() + "\n")
            self.stream.flush()
