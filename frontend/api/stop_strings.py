"""Stop strings: cut a choice's text at the first one, never letting a partial match reach the client."""


class StopStringMatcher:
    """Cuts the output at the first stop string, holding back any tail that could still become one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""

    def feed(self, text: str, final: bool, may_stop: bool = True) -> tuple[str, str | None]:
        """Returns (text safe to emit now, the stop string matched or None). With may_stop False (before
        min_tokens) nothing matches yet, but a possible start of a stop string is still held back."""
        if not self.stops:
            return text, None
        self.pending += text
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0] if may_stop else []
        if hits:
            i, stop = min(hits)
            out, self.pending = self.pending[:i], ""
            return out, stop
        keep = 0 if final else self._partial_match_len()
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def _partial_match_len(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:k]):
                    best = k
                    break
        return best
