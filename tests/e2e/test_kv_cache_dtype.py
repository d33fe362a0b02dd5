"""`--kv-cache-dtype` on real servers: with the same --kv-cache-memory, /metrics (vllm:cache_config_info) reports the
blocks each dtype buys: float16 twice float32's, int8 4 / (1 + 4 / head_dim) times (its codes plus a float32 scale
per token per kv head: 3.76x at head_dim 64), exactly what the workers' block budget computes; the default, auto,
stores float16 under the CPU's default kernel set (c-int8); and the int8 server serves. The three servers start at
once (a start is mostly waiting for the worker's model load)."""
import re

import httpx
import pytest

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, SIZED_BY_MEMORY, ServerProcess
from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.workers.kv_cache import bytes_per_block

BUDGET = 4 << 20
STORED = {"float32": "float32", "auto": "float16", "int8": "int8"}  # --kv-cache-dtype -> what the cache stores
DTYPES = tuple(STORED)


def cache_config(url: str) -> dict[str, str]:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\} 1\.0$", text, re.MULTILINE)
    assert m, f"no vllm:cache_config_info in /metrics:\n{text[:3000]}"
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """The tiny random model with head_dim 64 (a real model's), so int8's scales cost what they do there."""
    return make_tiny_gguf(tmp_path_factory.mktemp("wide") / "wide.gguf", dim=256, n_heads=4, n_kv_heads=2)


def test_metrics_report_the_blocks_each_dtype_buys(wide_model, tmp_path):
    servers = {d: ServerProcess(wide_model, tmp_path / f"{d}.log", "--kv-cache-memory", str(BUDGET),
                                "--kv-cache-dtype", d, defaults=SIZED_BY_MEMORY) for d in DTYPES}
    try:
        for server in servers.values():
            server.wait_ready()
        configs = {d: cache_config(s.url) for d, s in servers.items()}
        cfg = read_model_config(wide_model)
        blocks = {d: int(c["num_gpu_blocks"]) for d, c in configs.items()}
        print("blocks for", BUDGET, "bytes:", blocks)
        assert {d: c["cache_dtype"] for d, c in configs.items()} == STORED
        assert blocks == {d: BUDGET // bytes_per_block(cfg, 16, STORED[d]) for d in DTYPES}
        assert blocks["auto"] == 2 * blocks["float32"]
        assert blocks["int8"] / blocks["float32"] == pytest.approx(4 / (1 + 4 / cfg.head_dim), rel=0.01)
        assert f"{blocks['int8']} KV blocks of 16 tokens in int8" in servers["int8"].log()  # the ready line
        r = httpx.post(servers["int8"].url + "/v1/completions", timeout=REQUEST_TIMEOUT_S,
                       json={"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    finally:
        leftovers = {d: s.leftover_description for d, s in servers.items() if s.stop()}
    assert not leftovers, f"processes had to be killed: {leftovers}"
