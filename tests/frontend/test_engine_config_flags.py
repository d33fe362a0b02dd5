"""The command line is generated from protocol/engine_config.py and keeps every flag `tinyvllm serve`, `worker` and
`bench throughput` had before it was (recorded at 903dffe), with the same names and defaults; `--kernels` is new,
`--cpu-kernels` stays its alias; `--kv-events-config` came later (issue 35), `--load-format` too (issue 31)."""
import argparse

import pytest

from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.protocol.engine_config import KNOBS, EngineConfig

ENGINE_FLAGS = {
    "--async-scheduling --no-async-scheduling": True, "--beam": 0, "--block-size": 16, "--cpu-kernels --kernels": None,
    "--data-parallel-size -dp": 1, "--dtype": "auto", "--kv-cache-dir": None, "--kv-cache-dir-size": 4 << 30, "--kv-cache-dtype": "auto",
    "--kv-cache-memory": 1 << 30, "--kv-events-config": None, "--kv-host": "127.0.0.1", "--kv-lease-seconds": 30.0, "--kv-port": 0,
    "--kv-secret": None, "--load-format": "auto", "--max-model-len": None, "--max-num-batched-tokens": 512, "--max-num-seqs": 64,
    "--model": None, "--no-jit-warmup": True, "--no-prefix-caching": True, "--num-kv-blocks": 0,
    "--pipeline-parallel-size -pp": 1, "--role": "both", "--speculative-config": None, "--step-timeout": 120.0,
    "--swap-space": 0, "--tensor-parallel-size -tp": 1, "--warmup-before-serving": False,
    "--enable-lora": False, "--max-loras": 1, "--max-lora-rank": 16,
}
SERVE_FLAGS = {
    **ENGINE_FLAGS, "--advertise-url": None, "--allowed-origins": [], "--api-key": None, "--default-max-tokens": None,
    "--reasoning-parser": None, "--responses-store-size": 0,
    "--external-workers": False, "--host": "127.0.0.1", "--max-waiting-requests": 512,
    "--models-dir": None,  # the cache's models folder, resolved when serving: given without --model, on demand
    "--keep-alive": None, "--max-loaded-models": 0, "--lora-modules": [], "--port": 8000, "--register-secret": None, "--register-with": None,
    "--request-timeout": None, "--served-model-name": None, "--shutdown-timeout": 30.0, "--worker-address": None,
    "--worker-secret": None,
}
WORKER_FLAGS = {
    "--beam": 0, "--connect": None, "--cpu-kernels --kernels": None, "--model": None, "--no-jit-warmup": True,
    "--local-count": None, "--local-index": None,  # new: the launcher's device placement, for deploy/workers.sh
    "--pipeline-parallel-size -pp": 1, "--rank": None, "--stage-address": None, "--tensor-parallel-size -tp": 1,
    "--worker-secret": None,
}
BENCH_THROUGHPUT_FLAGS = {
    **ENGINE_FLAGS, "--input-len --random-input-len": 1024, "--json": None, "--num-prompts": 1000,
    "--num-warmups --warmup": 0, "--output-len --random-output-len": 128, "--seed": 0,
}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def _flag_table(parser: argparse.ArgumentParser) -> dict:
    return {" ".join(sorted(a.option_strings)): a.default for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


@pytest.mark.parametrize("command, expected", [(("serve",), SERVE_FLAGS), (("worker",), WORKER_FLAGS),
                                               (("bench", "throughput"), BENCH_THROUGHPUT_FLAGS)])
def test_every_flag_keeps_its_name_and_default(command, expected):
    parser = build_parser()
    for name in command:
        parser = _subparser(parser, name)
    assert _flag_table(parser) == expected


def test_the_command_line_and_the_library_build_the_same_config():
    flags = ["serve", "--max-num-seqs", "8", "--kv-cache-memory", "512M", "--swap-space", "0.5", "-tp", "2",
             "--cpu-kernels", "c", "--no-prefix-caching", "--no-async-scheduling", "--role", "decode",
             "--kv-lease-seconds", "7", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}']
    from_cli = EngineConfig.from_namespace(build_parser().parse_args(flags), environ={})
    from_keywords = EngineConfig.of(max_num_seqs=8, kv_cache_memory="512M", swap_space=1 << 29, tensor_parallel_size=2,
                                    kernels="c", enable_prefix_caching=False, async_scheduling=False, role="decode",
                                    kv_lease_s=7.0, jit_warmup=True,
                                    speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert from_cli == from_keywords
    assert from_cli.cache.kv_cache_memory == 512 << 20 and from_cli.speculative_config.num_speculative_tokens == 2


def test_defaults_are_the_declared_ones_everywhere():
    """The library's defaults are the declarations'; the command line differs only where a knob says so
    (jit_warmup: on for a server, off for LLM(...); secrets: None until resolved from the environment)."""
    config, parsed = EngineConfig(), build_parser().parse_args(["serve"])
    for knob in KNOBS.values():
        assert knob.get(config) == knob.default
        if knob.flag and knob.name not in ("jit_warmup", "worker_secret", "kv_secret"):
            assert getattr(parsed, knob.name) == knob.default, knob.name
    assert EngineConfig.from_namespace(parsed, environ={}) == EngineConfig.of(jit_warmup=True)


def test_an_unknown_or_misspelt_option_is_refused():
    with pytest.raises(TypeError, match="max_num_seq"):
        EngineConfig.of(max_num_seq=8)
    assert EngineConfig.of(cpu_kernels="c").kernels.kernels == "c"  # the old keyword still works


def test_secrets_come_from_the_environment_and_never_leave_the_process():
    parsed = build_parser().parse_args(["serve", "--role", "prefill"])
    config = EngineConfig.from_namespace(parsed, environ={"TINYVLLM_KV_SECRET": "k" * 32,
                                                         "TINYVLLM_WORKER_SECRET": "w" * 32})
    assert config.kv_transfer.kv_secret == "k" * 32 and config.parallel.worker_secret == "w" * 32
    public = config.public()
    assert public.kv_transfer.kv_secret == "" and public.parallel.worker_secret == ""
    assert "k" * 32 not in repr(config) and "kv_secret" not in config.flat()


def test_the_config_travels_as_itself_in_init_worker():
    from tinyvllm.protocol.codec import decode, encode
    from tinyvllm.protocol.messages import InitWorker
    config = EngineConfig.of(max_num_seqs=3, kv_cache_dtype="int8",
                             speculative_config='{"method": "draft_model", "model": "draft.gguf"}')
    msg = InitWorker(config.public().serving(256), "group", "")
    assert decode(encode(msg)) == msg


def test_the_cache_is_sized_by_memory_or_by_blocks_not_both(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--num-kv-blocks", "3", "--kv-cache-memory", "2G"])
    assert "not allowed with" in capsys.readouterr().err
    serve_help = _subparser(build_parser(), "serve").format_help()
    assert serve_help.count("disaggregated prefill/decode (docs/DEPLOY.md)") == 1
