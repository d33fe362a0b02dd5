"""The persistent prefix cache through real processes (`serve --kv-cache-dir`): a 1,000-token prompt served, the
server stopped and started again over the same folder, the prompt comes back from disk (cached_tokens >= 990) with the
same greedy output; with one of its block files truncated, the next start still answers the same, recomputing what
that file held (fewer cached tokens) and saying so in its log."""
from __future__ import annotations

import httpx
import pytest

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, start_server, wait_until
from tests.helpers.tiny_model import make_tiny_gguf

PROMPT = [1000 + (i * 7919) % 40000 for i in range(1000)]  # token ids: exactly 1,000 prompt tokens
BLOCK = 16
FULL_BLOCKS = (len(PROMPT) + 7) // BLOCK  # the full blocks of prompt + 8 outputs but the last (never computed)


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    return make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny2k.gguf", context=2048)


def serve_once(model, log_path, cache_dir) -> tuple[str, int, list]:
    """Starts a server over cache_dir, sends PROMPT, waits until every full block is on disk, stops it:
    (text, cached tokens, the block files)."""
    server = start_server(model, log_path, "--kv-cache-dir", str(cache_dir), "--num-kv-blocks", "128",
                          "--block-size", str(BLOCK))
    try:
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8,
                                                             "temperature": 0}, timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert wait_until(lambda: len(list(cache_dir.glob("*/*.kv"))) == FULL_BLOCKS, 30), server.log_tail()
    finally:
        assert not server.stop(), f"processes left running: {server.leftover_description}"
    assert server.proc.returncode == 0, server.log_tail()
    return (answer["choices"][0]["text"], answer["usage"]["prompt_tokens_details"]["cached_tokens"],
            sorted(cache_dir.glob("*/*.kv")))


def test_a_prompt_is_loaded_from_disk_after_a_restart(long_context_model, tmp_path):
    cache_dir = tmp_path / "kv-cache"
    text, cached, files = serve_once(long_context_model, tmp_path / "first.log", cache_dir)
    assert cached == 0 and len(files) == FULL_BLOCKS

    again, cached, _ = serve_once(long_context_model, tmp_path / "second.log", cache_dir)
    assert again == text
    assert cached >= 990, cached

    truncated = files[len(files) // 2]
    truncated.write_bytes(truncated.read_bytes()[:1000])
    third, cached_after, files_after = serve_once(long_context_model, tmp_path / "third.log", cache_dir)
    assert third == text
    assert cached_after < cached
    assert "not loaded: truncated" in (tmp_path / "third.log").read_text()
    assert truncated in files_after and truncated.stat().st_size > 1000, "the recomputed block was not saved again"
