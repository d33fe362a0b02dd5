"""KV cache dtypes (workers/kv_quant.py): what each stores, and paged attention over it under both kernel sets.

Each dtype's stored values are within its rounding bound of the float32 written (int8: half a step of absmax/127 per
token per head; fp8 e4m3: 2^-4 relative, or half a subnormal step; float16 2^-11 and bfloat16 2^-8 relative); the
attention of both kernel sets equals a float64 softmax over exactly those stored values (so the C kernel decodes
what tinygrad decodes), and stays within a stated bound of the float32 cache's attention. fp8 and bfloat16 codes are
bit-identical to torch's float8_e4m3fn and bfloat16 (round to nearest even)."""
import numpy as np
import pytest
import torch
from tinygrad import Tensor

from tests.workers.dense_reference import random_llama
from tinyvllm.protocol.kernel_choice import KernelChoice
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.workers.attention import PagedAttention
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_cache import PagedKVCache, bytes_per_block, cache_dtype
from tinyvllm.workers.kv_quant import decode, dequantize, encode, quantize
from tinyvllm.workers.kv_write import write_layer
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner

CFG = ModelConfig(arch="llama", vocab_size=97, dim=128, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=48,
                  rope_theta=10000.0, rms_eps=1e-5, max_context=128, tie_embeddings=False)
BS, NUM_BLOCKS, MAXB = 4, 12, 6
DTYPES = ["float32", "float16", "bfloat16", "int8", "fp8"]
# largest |attention(dtype) - attention(float32)| on these inputs (values ~ N(0, 1), outputs ~ 0.3): the bound stated
ATTENTION_BOUND = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2, "int8": 2e-2, "fp8": 8e-2}


def stored_bound(name: str, kv: np.ndarray) -> np.ndarray:
    absmax = np.abs(kv).max(-1, keepdims=True)
    return {"float32": 0 * kv, "float16": np.abs(kv) * 2.0 ** -11 + 2.0 ** -25,
            "bfloat16": np.abs(kv) * 2.0 ** -8, "int8": 0 * kv + absmax / 127 * 0.5 * (1 + 1e-6),
            "fp8": np.abs(kv) * 2.0 ** -4 + absmax / 448 * 2.0 ** -10}[name] + 1e-7


def attention_reference(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """Causal softmax(q k^T / sqrt(d)) v over one sequence: q [T, H, D], kv [T, 2, KVH, D] -> [T, H * D]."""
    T, H, D = q.shape
    group = H // kv.shape[2]
    out = np.zeros((T, H, D))
    for t in range(T):
        for h in range(H):
            k, v = kv[:t + 1, 0, h // group].astype(np.float64), kv[:t + 1, 1, h // group].astype(np.float64)
            s = k @ q[t, h] / np.sqrt(D)
            e = np.exp(s - s.max())
            out[t, h] = e @ v / e.sum()
    return out.reshape(T, H * D)


def attend_in_two_chunks(cache: PagedKVCache, q: np.ndarray, kv: np.ndarray, table: np.ndarray, kernels: KernelChoice):
    """Writes and attends positions 0..9, then 10..19 (later tokens land in a block already holding others)."""
    outs = []
    for start, stop in ((0, 10), (10, len(q))):
        n = stop - start
        positions = Tensor(np.arange(start, stop, dtype=np.int32))
        attend = PagedAttention(cache, Tensor(table[None]), Tensor(np.zeros(n, np.int32)), positions,
                                Tensor(np.array([n], np.int32)), MAXB, kernels)
        outs.append(attend(0, Tensor(q[start:stop]), Tensor(kv[start:stop])).numpy())
    return np.concatenate(outs)


def stored_values(cache: PagedKVCache, table: np.ndarray, T: int) -> np.ndarray:
    """The cache's values of a sequence's first T positions, as attention sees them (dequantised)."""
    values = dequantize(cache.layers[0], cache.layer_scales(0), cache.dtype).numpy()
    return values[[table[p // BS] * BS + p % BS for p in range(T)]]


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    T = 20
    q = rng.standard_normal((T, CFG.n_heads, CFG.head_dim)).astype(np.float32)
    kv = rng.standard_normal((T, 2, CFG.n_kv_heads, CFG.head_dim)).astype(np.float32)
    kv[3, 1, 0] = 0  # a head of zeros: scale 0, no NaN
    kv[5, 0, 1] *= 1e-3  # a head of small values: int8/fp8 scale them up, fp8 without subnormal trouble
    table = rng.permutation(NUM_BLOCKS)[:MAXB].astype(np.int32)
    return q, kv, table


@pytest.mark.parametrize("name", DTYPES)
def test_attention_over_each_dtype(name, inputs, kernel_set):
    q, kv, table = inputs
    cache = PagedKVCache(CFG, NUM_BLOCKS, BS, name)
    got = attend_in_two_chunks(cache, q, kv, table, KernelChoice.named(kernel_set))
    stored = stored_values(cache, table, len(q))
    assert np.all(np.abs(stored - kv) <= stored_bound(name, kv)), f"{name}: a value off by more than its rounding"
    np.testing.assert_allclose(got, attention_reference(q, stored), atol=2e-5, rtol=0)
    error = np.abs(got - attention_reference(q, kv)).max()
    print(f"{name} {kernel_set}: max |attention - float32 attention| = {error:.2e}")
    assert error <= ATTENTION_BOUND[name]


def test_block_bytes_shrink_with_the_dtype():
    per_value = {name: bytes_per_block(CFG, BS, name) / (2 * BS * CFG.n_kv_heads * CFG.head_dim) for name in DTYPES}
    assert per_value == {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1 + 4 / 32, "fp8": 1 + 4 / 32}
    assert bytes_per_block(CFG, BS, "auto") == bytes_per_block(CFG, BS, "float16")  # the CPU's default set: c-int8
    assert cache_dtype("auto", "c-int8") == cache_dtype("auto") == "float16"
    assert cache_dtype("auto", "c") == cache_dtype("auto", "tinygrad") == "float32"  # the exact sets


def test_fp8_and_bfloat16_codes_match_torch():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-448, 448, 4000), rng.uniform(-0.05, 0.05, 4000)]).astype(np.float32)
    fp8 = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(encode(Tensor(x), "fp8").numpy(), fp8)
    every_code = np.arange(256, dtype=np.uint8)
    finite = every_code & 0x7F != 0x7F  # 0x7F and 0xFF are NaN
    expected = torch.from_numpy(every_code).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(decode(Tensor(every_code), "fp8").numpy()[finite], expected[finite])
    bf16 = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(encode(Tensor(x), "bfloat16").numpy(), bf16)


def test_block_bytes_and_block_copy_carry_the_scales(inputs):
    """KVBlockIO's bytes are exactly bytes_per_block (values, then scales), they move a block between caches, and
    a kv head range of them is that range's values and scales; copy-on-write copies the scales too."""
    q, kv, table = inputs
    name = "int8"
    source, target = PagedKVCache(CFG, NUM_BLOCKS, BS, name), PagedKVCache(CFG, NUM_BLOCKS, BS, name)
    slots = np.array([table[p // BS] * BS + p % BS for p in range(len(q))], np.int32)
    Tensor.realize(*write_layer(source, 0, Tensor(kv), Tensor(slots)))
    source_io, target_io = KVBlockIO(source), KVBlockIO(target)
    data = source_io.read(int(table[1]))
    assert len(data) == source_io.nbytes == bytes_per_block(CFG, BS, name)
    target_io.write(7, data)
    expected = stored_values(source, table, len(q))[BS:2 * BS]
    np.testing.assert_array_equal(stored_values(target, np.array([7]), BS), expected)
    one_head = source_io.parts(source_io.heads(data, 1, 2), kv_heads=1)
    for part, whole in zip(one_head, source_io.parts(data)):
        np.testing.assert_array_equal(part, whole[:, :, :, 1:2])
    runner = ModelRunner(Transformer(CFG, random_llama(CFG), 64), target, max_num_seqs=2, max_model_len=32,
                         max_num_batched_tokens=8)
    runner.copy_blocks([[7, 2]])
    np.testing.assert_array_equal(stored_values(target, np.array([2]), BS), expected)


def test_a_half_cache_saturates_instead_of_storing_inf():
    """A key or value beyond float16's range is stored as +-65504, not inf (which would turn attention's sums over
    it into NaN)."""
    codes, _ = quantize(Tensor(np.array([1e6, -7e4, 1.5, 65504.0], np.float32)), "float16")
    assert decode(codes, "float16").numpy().tolist() == [65504.0, -65504.0, 1.5, 65504.0]
