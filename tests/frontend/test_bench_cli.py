"""`tinyvllm bench ...` parsing, and `bench serve` end to end against tinyvllm's own app (fake engine and
character tokenizer) served by uvicorn on a free port."""
import json
import socket
import threading
import time

import pytest
import uvicorn

import tinyvllm.frontend.cli.bench.serve as bench_serve
from app_harness import MODEL, make_app
from fake_tokenizer import OFFSET, CharTokenizer
from tinyvllm.frontend.cli import main as cli
from tinyvllm.protocol.engine_config import EngineConfig


class AsciiTokenizer(CharTokenizer):
    vocab_size = OFFSET + 128


def test_bench_serve_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "serve", "--help"])
    assert e.value.code == 0 and "--max-concurrency" in capsys.readouterr().out


def test_bench_serve_parses_a_sweep_and_vllm_names():
    args = cli.build_parser().parse_args(["bench", "serve", "--max-concurrency", "1", "4", "16", "--request-rate",
                                          "2.5", "--num-warmups", "3", "--ignore-eos", "--endpoint",
                                          "/v1/chat/completions"])
    assert (args.command, args.bench, args.max_concurrency) == ("bench", "serve", [1, 4, 16])
    assert (args.request_rate, args.warmup, args.ignore_eos, args.progress) == (2.5, 3, True, True)
    defaults = cli.build_parser().parse_args(["bench", "serve"])
    assert defaults.max_concurrency is None and defaults.request_rate == float("inf") and not defaults.ignore_eos
    assert defaults.endpoint == "/v1/completions" and defaults.num_prompts == 1000


def test_bench_throughput_shares_the_engine_flags_with_serve():
    args = cli.build_parser().parse_args(["bench", "throughput", "--model", "m.gguf", "--max-num-seqs", "4",
                                          "--num-kv-blocks", "64", "--no-prefix-caching", "--input-len", "8",
                                          "--random-output-len", "3"])
    engine = EngineConfig.from_namespace(args)
    assert (engine.model.model, engine.batch.max_num_seqs, engine.cache.num_kv_blocks,
            engine.cache.enable_prefix_caching) == ("m.gguf", 4, 64, False)
    assert (args.input_len, args.output_len, args.num_prompts) == (8, 3, 1000)
    serve_engine = EngineConfig.from_namespace(cli.build_parser().parse_args(["serve", "--max-num-seqs", "4"]))
    assert serve_engine.batch.max_num_seqs == 4
    assert serve_engine.batch.max_num_batched_tokens == engine.batch.max_num_batched_tokens


def test_bench_serve_refuses_bad_values(capsys):
    assert cli.main(["bench", "serve", "--max-concurrency", "0"]) == 2
    assert cli.main(["bench", "serve", "--random-input-len", "0"]) == 2


@pytest.fixture
def server(monkeypatch):
    """The app on a free port in a thread; yields (base URL, the fake engine)."""
    app, engine, _ = make_app(max_model_len=256)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.01)
    monkeypatch.setattr(bench_serve, "load_tokenizer", lambda tokenizer, model: AsciiTokenizer())
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("TINYVLLM_API_KEY", raising=False)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    uv.should_exit = True
    thread.join(5)
    sock.close()


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_bench_serve_sweeps_a_server_and_writes_json(server, endpoint, tmp_path, capsys):
    base_url, engine = server
    out = tmp_path / "result.json"
    code = cli.main(["bench", "serve", "--base-url", base_url, "--endpoint", endpoint, "--num-prompts", "4",
                     "--random-input-len", "6", "--random-output-len", "5", "--ignore-eos", "--max-concurrency", "1",
                     "2", "--warmup", "1", "--json", str(out), "--disable-tqdm"])
    stdout = capsys.readouterr().out
    assert code == 0
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 3 and rows[1].startswith("| 1 | 4 | 0 |") and rows[2].startswith("| 2 | 4 | 0 |")
    result = json.loads(out.read_text())
    assert result["config"]["model"] == MODEL and result["config"]["max_concurrency"] == [1, 2]
    for level in result["results"]:
        assert level["completed"] == 4 and level["output_lens"] == [5] * 4 and level["total_output_tokens"] == 20
        assert all(len(itl) == 4 for itl in level["itls"]) and level["mean_tpot_ms"] > 0
    if endpoint == "/v1/completions":  # the app's usage counts the prompt as the fake tokenizer does: BOS + 6
        assert all(n == 7 for level in result["results"] for n in level["input_lens"])
    sent = [r.prompt_token_ids for r in engine.requests.values()]
    assert len(sent) == 2 * (1 + 4) and len({tuple(ids) for ids in sent}) == 10  # warm-ups and levels differ


def test_bench_serve_with_a_poisson_rate_and_failures(server, capsys):
    base_url, _ = server
    code = cli.main(["bench", "serve", "--base-url", base_url, "--model", "no-such-model", "--num-prompts", "3",
                     "--random-input-len", "4", "--random-output-len", "2", "--request-rate", "50", "--disable-tqdm"])
    captured = capsys.readouterr()
    assert code == 1  # every request failed: the app refuses an unknown model
    assert "| unlimited | 3 | 3 |" in captured.out and "3x HTTP 404" in captured.err


def test_bench_serve_without_a_server_is_an_error(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["bench", "serve", "--port", str(port), "--num-prompts", "1"]) == 2
    assert "ConnectError" in capsys.readouterr().err
