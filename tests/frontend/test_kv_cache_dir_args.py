"""`tinyvllm serve --kv-cache-dir DIR [--kv-cache-dir-size N]`: the folder reaches the workers and the bound the
scheduler; refused with pipeline parallelism, without prefix caching, or with a size that is not positive."""
import json

import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import CacheConfig, EngineConfig


@pytest.mark.parametrize("change, message", [
    ({"pipeline_parallel_size": 2}, "--pipeline-parallel-size 1"),
    ({"enable_prefix_caching": False}, "needs prefix caching"),
    ({"kv_cache_dir_bytes": 0}, "--kv-cache-dir-size must be positive"),
])
def test_engine_args_refuse(change, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.of(kv_cache_dir="/tmp/kv", **change).validate()
    EngineConfig.of(kv_cache_dir="/tmp/kv").validate()


def test_serve_flags(serve_calls):
    assert cli.main(["serve", "--kv-cache-dir", "/data/kv", "--kv-cache-dir-size", "2G"]) == 0
    assert cli.main(["serve"]) == 0
    with_dir, without = (c.cache for c, _ in serve_calls)
    assert (with_dir.kv_cache_dir, with_dir.kv_cache_dir_bytes) == ("/data/kv", 2 << 30)
    assert (without.kv_cache_dir, without.kv_cache_dir_bytes) == (None, CacheConfig().kv_cache_dir_bytes) == \
        (None, 4 << 30)


def test_the_launcher_gives_the_folder_to_the_workers_and_the_bound_to_the_scheduler(tiny_model, tmp_path):
    procs = EngineProcesses(EngineConfig.of(model=tiny_model, kv_cache_dir=str(tmp_path), kv_cache_dir_bytes=12345))
    try:
        scheduler, worker = (json.loads(p.command[-1])[1]["engine"]["cache"] for p in procs.processes)
        assert scheduler["kv_cache_dir_bytes"] == 12345 and worker["kv_cache_dir"] == str(tmp_path)
    finally:
        procs.stop()
