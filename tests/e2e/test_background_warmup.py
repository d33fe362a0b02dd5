"""A lone worker serves at once and captures its jitted steps while idle (workers/background_warmup.py): the server
is ready before the captures finish, answers meanwhile, and answers the same once every bucket is captured."""
import re

from tests.e2e.http_helpers import complete, completion_body
from tests.e2e.server_process import READY_LINE, SERVE_DEFAULTS, ServerProcess, wait_until

DONE = "background warm-up done"


def test_serves_before_and_after_the_background_captures(tiny_model, tmp_path):
    defaults = tuple(a for a in SERVE_DEFAULTS if a != "--no-jit-warmup")
    server = ServerProcess(tiny_model, tmp_path / "server.log", "--max-num-batched-tokens", "4", "--max-num-seqs",
                           "2", defaults=defaults)
    try:
        server.wait_ready()
        body = completion_body("The sky is", max_tokens=6, temperature=0)
        first, _ = complete(server.url, "/v1/completions", body)
        assert wait_until(lambda: DONE in server.log(), 180), server.log_tail()
        again, _ = complete(server.url, "/v1/completions", body)
        assert again == first
        log = server.log()
        assert log.index(READY_LINE) < log.index(DONE)
        captured = re.findall(r"captured the (\d+)-token step", log)
        assert captured == sorted(captured, key=int) and set(captured) <= {"1", "2", "4"}, captured
    finally:
        assert not server.stop(), server.leftover_description
