"""`tinyvllm bench throughput` end to end: the real engine processes on a tiny random model (here, not in
tests/frontend, because starting the engine and compiling its kernels takes a while on a CPU)."""
import json

from tinyvllm.frontend.cli import main as cli
from tests.helpers.tiny_model import make_tiny_gguf


def test_bench_throughput_on_the_tiny_model(tmp_path, capsys):
    model, out = make_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "result.json"
    code = cli.main(["bench", "throughput", "--model", str(model), "--num-prompts", "3", "--input-len", "5",
                     "--output-len", "4", "--max-num-seqs", "4", "--num-kv-blocks", "32", "--max-model-len", "64",
                     "--warmup", "1", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0 and "Throughput: " in stdout and "requests/s" in stdout
    result = json.loads(out.read_text())
    assert (result["num_requests"], result["failed"]) == (3, 0)
    assert (result["total_prompt_tokens"], result["total_output_tokens"]) == (15, 12)  # exact lengths, ignore_eos
    assert result["total_num_tokens"] == 27 and result["output_tokens_per_second"] > 0
    assert result["tokens_per_second"] == result["total_num_tokens"] / result["elapsed_time"]
    assert result["config"]["engine"]["max_num_seqs"] == 4
