"""A served model's worker holds its weights at their stored size: resident memory (VmRSS, from /proc) at most the
GGUF file's size plus its KV cache plus 400 MB (the interpreter, tinygrad, buffers of the steps), loaded directly or
mapped from a weight pack. The model: a Q4_K_M-style twin (Q4_K matrices, Q6_K for the embedding and the down
projections) of 1024 wide and 8 layers deep, 98 MB (its weights take 101 MB on the device: the file's bits, each
super-block's d as float32); benchmarks/model_memory.py reports the same on real sizes."""
import os

import numpy as np
import pytest

from tests.e2e.server_process import cmdline, descendants
from tests.helpers.gguf_writer import Blocks, write_gguf
from tests.workers.test_stored_quant_types import random_blocks
from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.kv_cache import bytes_per_block

DIM, FFN, LAYERS = 1024, 2816, 8
OVERHEAD_BYTES = 400 << 20
KV_BLOCKS = 64


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    from transformers import LlamaConfig
    from tests.helpers.hf_to_gguf import gguf_metadata
    from tests.helpers.tiny_model import VOCAB_SIZE as VOCAB, tokenizer_metadata  # the default model's tokenizer
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=16,
                         num_key_value_heads=4, intermediate_size=FFN, max_position_embeddings=512,
                         rms_norm_eps=1e-5, tie_word_embeddings=True)
    shapes = {"attn_q": (DIM, DIM), "attn_k": (DIM // 4, DIM), "attn_v": (DIM // 4, DIM), "attn_output": (DIM, DIM),
              "ffn_gate": (FFN, DIM), "ffn_up": (FFN, DIM), "ffn_down": (DIM, FFN)}
    blocks = lambda t, shape, seed: (Blocks(random_blocks(t, *shape, seed=seed, extremes=False, scale_std=1e-4), t), t)
    tensors = {"token_embd.weight": blocks("Q6_K", (VOCAB, DIM), 0), "output_norm.weight": (np.ones(DIM), "F32")}
    for i in range(LAYERS):
        for j, (name, shape) in enumerate(shapes.items()):
            tensors[f"blk.{i}.{name}.weight"] = blocks("Q6_K" if name == "ffn_down" else "Q4_K", shape, 10 * i + j + 1)
        for norm in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{i}.{norm}.weight"] = (np.ones(DIM), "F32")
    metadata = {**gguf_metadata(config, "llama"), **tokenizer_metadata()}
    return write_gguf(tmp_path_factory.mktemp("twin") / "twin-q4_k_m.gguf", metadata, tensors)


def my_workers() -> set[int]:
    """The tinyvllm worker processes among this process's descendants."""
    return {pid for pid in descendants(os.getpid()) if "tinyvllm.workers.main" in cmdline(pid)}


def vm_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("load_format", ["direct", "packed"])
def test_the_workers_memory_is_the_files_size_plus_its_kv_cache_and_a_bounded_overhead(twin, load_format):
    kv_bytes = KV_BLOCKS * bytes_per_block(read_model_config(twin), 16, "auto")
    others = my_workers()  # servers this test process shares with other tests
    with LLM(str(twin), max_num_seqs=2, max_model_len=256, num_kv_blocks=KV_BLOCKS, load_format=load_format) as llm:
        out = llm.generate([[1, 2, 3, 4, 5, 6, 7, 8]] * 2, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert all(len(o.token_ids) == 8 for o in out)
        (worker,) = my_workers() - others
        rss, weights = vm_rss_bytes(worker), llm.ready.worker_weight_bytes[0]
    size = twin.stat().st_size
    assert 0.95 * size <= weights <= 1.05 * size  # stored as the file stores them (float32 super-block scales aside)
    assert rss <= size + kv_bytes + OVERHEAD_BYTES, (rss / 1e6, size / 1e6, kv_bytes / 1e6)
