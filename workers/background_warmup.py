"""Start-up captures off the critical path: a lone worker reports ready at once and captures its token buckets'
jitted steps while it has nothing else to do, smallest first (a decode step's bucket is the first every request
needs). A step that arrives meanwhile waits for at most the capture in progress; a bucket a served step already
captured is skipped; a step loaded from the disk (workers/captured_steps.py) is run once, and captured steps are
written there. Workers that meet others in every step (tensor or pipeline parallel) and prefill/decode
workers (a peer's KV pull would wait behind a capture) capture before serving instead (workers.main
warms_up_in_background)."""
import logging
import time

log = logging.getLogger(__name__)


class BackgroundWarmup:
    def __init__(self, runner, rank: int):
        self.runner, self.rank = runner, rank
        self.pending = list(runner.token_buckets)
        self.total, self.captured, self.start = len(self.pending), 0, time.monotonic()
        self.reported = False

    @property
    def done(self) -> bool:
        """Nothing left to capture, nor to store (a step a served request captured later is stored then too)."""
        steps = self.runner.captured_steps  # workers/captured_steps.py
        return not self.pending and not (steps is not None and steps.pending)

    def capture_next(self) -> None:
        """One piece of idle work: the next bucket's capture, else the next captured step written to the disk."""
        if self.pending:
            size = self.pending.pop(0)
            started = time.monotonic()
            if self.runner.warm_up_bucket(size):
                self.captured += 1
                log.info("rank %d: prepared the %d-token step in %.1fs (background warm-up, %d of %d buckets left)",
                         self.rank, size, time.monotonic() - started, len(self.pending), self.total)
            if not self.pending:
                self.runner.finish_warm_up()
        else:
            self.runner.captured_steps.store_next()
        if self.done and not self.reported:
            self.reported = True
            log.info("rank %d: background warm-up done: %d jitted steps prepared in %.0fs (the rest by served steps)",
                     self.rank, self.captured, time.monotonic() - self.start)
