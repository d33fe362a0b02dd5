"""`tinyvllm serve --kv-cache-dtype` reaches the engine args and, through the launcher, the scheduler (which hands it
to every worker in InitWorker); an unknown dtype is refused; /metrics names the dtype the cache stores."""
import json

import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.frontend.api.metrics import cache_config_info
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import EngineReady


def test_serve_passes_the_dtype(serve_calls):
    for argv in (["serve", "--kv-cache-dtype", "int8"], ["serve", "--kv-cache-dtype", "bfloat16"], ["serve"]):
        assert cli.main(argv) == 0
    assert [a.cache.kv_cache_dtype for a, _ in serve_calls] == ["int8", "bfloat16", "auto"]


def test_an_unknown_dtype_is_refused(serve_calls, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--kv-cache-dtype", "fp4"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err and not serve_calls
    with pytest.raises(ValueError, match="--kv-cache-dtype 'fp4'"):
        EngineConfig.of(kv_cache_dtype="fp4").validate()


def test_the_launcher_hands_it_to_the_scheduler(default_model_path):
    processes = EngineProcesses(EngineConfig.of(model=str(default_model_path), kv_cache_dtype="fp8")).processes
    scheduler = next(p for p in processes if p.name == "tinyvllm-scheduler")
    assert json.loads(scheduler.command[-1])[1]["engine"]["cache"]["kv_cache_dtype"] == "fp8"  # SchedulerArgs


def test_cache_config_info_labels():
    family = cache_config_info(EngineReady(300, 16, 256, 8, 1, kv_cache_dtype="int8"))
    assert family.name == "vllm:cache_config_info"
    assert family.samples[0].labels == {"block_size": "16", "cache_dtype": "int8", "num_gpu_blocks": "300"}
