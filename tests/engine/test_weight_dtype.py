"""--dtype (protocol/engine_config.py ModelOptions.dtype) through the real scheduler and worker processes: auto keeps
the file's widths, float32 widens every weight at load (the same values: the exact kernels give the same tokens),
bfloat16 stores the unquantised matrices in 16 bits. The tiny model's embedding is F16, its attention
F32 and its feed-forward Q8_0."""
import numpy as np
import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams
from tests.helpers.tiny_model import make_tiny_gguf

ENGINE = dict(max_num_seqs=2, num_kv_blocks=32, max_num_batched_tokens=32, max_model_len=128, kernels="c")
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """{dtype: (the worker's weight bytes, greedy tokens)}."""
    path = str(make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", n_layers=2))
    prompt = np.random.default_rng(0).integers(100, 40000, 12).tolist()
    out = {}
    for dtype in ("auto", "float32", "bfloat16"):  # float16's narrowing: tests/workers/test_stored_float_checkpoints.py
        with LLM(path, dtype=dtype, **ENGINE) as llm:
            out[dtype] = llm.ready.worker_weight_bytes[0], llm.generate([prompt], GREEDY)[0].token_ids
    return out


def test_float32_widens_every_weight_to_the_same_values(served):
    (auto_bytes, auto_tokens), (wide_bytes, wide_tokens) = served["auto"], served["float32"]
    assert wide_tokens == auto_tokens
    assert 1.9 * auto_bytes < wide_bytes  # the F16 embedding (most of the bytes) doubles, Q8_0 grows ~3.6x


def test_bfloat16_halves_the_float32_matrices(served):
    auto_bytes, (weight_bytes, tokens) = served["auto"][0], served["bfloat16"]
    attention_f32 = 2 * (2 * 64 * 64 + 2 * 32 * 64) * 4  # 2 layers of q, o [64, 64] and k, v [32, 64], float32
    assert len(tokens) == GREEDY.max_tokens
    # the attention matrices halve; the F16 embedding stays 16-bit, the Q8_0 blocks and the norms as they are
    assert weight_bytes == auto_bytes - attention_f32 // 2, (weight_bytes, auto_bytes)
