"""The CPU attention kernel (workers/cpu_attention.py) against a numpy softmax(q k^T / sqrt(d)) v over each
token's own sequence's blocks: scattered and shared block ids, grouped query heads, lengths that end mid-block, a
length of zero, scores spread over tens of units, decodes and causal prompt chunks of several sequences in one flat
batch, chunks longer than the kernel's query tiles with a sliding window and soft-capped scores; and inside a
TinyJit whose inputs change between calls (the CPU graph patches them). The windows, caps, sinks and freed blocks
also for tinygrad's in-place attention (workers/paged_products.py), what GPUs run, over int8 and fp8 caches too."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit

from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.cpu_attention import cpu_paged_attention, supports
from tinyvllm.workers.kernel_set import configure_device
from tinyvllm.workers.paged_products import paged_attention_in_place

BS, MAXB, KVH, H, D = 4, 5, 2, 6, 32


def reference(q, cache, tables, lens, window=0, softcap=0.0, sinks=None):
    B = q.shape[0]
    out = np.zeros((B, H, D), np.float64)
    for b in range(B):
        first = max(0, lens[b] - window) if window else 0
        slots = [tables[b, p // BS] * BS + p % BS for p in range(first, lens[b])]
        for h in range(H):
            if not slots:
                continue
            k, v = cache[slots, 0, h // (H // KVH)], cache[slots, 1, h // (H // KVH)]
            s = k.astype(np.float64) @ q[b, h] / np.sqrt(D)
            s = softcap * np.tanh(s / softcap) if softcap else s
            top = s.max() if sinks is None else max(s.max(), sinks[h])
            e = np.exp(s - top)
            out[b, h] = e @ v / (e.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top)))
    return out.reshape(B, H * D)


def inputs(rng, B):
    n_blocks = 12
    cache = rng.standard_normal((n_blocks * BS, 2, KVH, D)).astype(np.float32) * 3
    tables = np.stack([rng.permutation(n_blocks)[:MAXB] for _ in range(B)]).astype(np.int32)
    tables[-1, 0] = tables[0, 0]  # a block two sequences share (a cached prefix)
    lens = rng.integers(1, MAXB * BS + 1, size=B).astype(np.int32)
    lens[0] = MAXB * BS  # the whole table
    # q and k ~ 3 N(0, 1): scores spread over tens of units, so the softmax's exp sees a wide range
    return rng.standard_normal((B, H, D)).astype(np.float32) * 3, cache, tables, lens


def decode(q: Tensor, cache: Tensor, tables: Tensor, lens: Tensor) -> Tensor:
    """One token per sequence: row b's token is the last of its lens[b] positions."""
    rows = Tensor(np.arange(q.shape[0], dtype=np.int32))
    return cpu_paged_attention(q, cache, tables, rows, (lens - 1).cast("int32"), BS)


@pytest.mark.parametrize("B", [1, 3, 8])
def test_matches_numpy(B):
    q, cache, tables, lens = inputs(np.random.default_rng(B), B)
    if B == 3:
        lens[1] = 0  # nothing to attend to: zeros, not NaN
    got = decode(Tensor(q), Tensor(cache), Tensor(tables), Tensor(lens)).numpy()
    np.testing.assert_allclose(got, reference(q, cache, tables, lens), rtol=5e-6, atol=1e-5)


def test_in_a_jit_with_new_inputs_each_call():
    configure_device("CPU", "c")
    rng = np.random.default_rng(7)

    @TinyJit
    def step(q, cache, tables, lens):
        return (decode(q * 1.0, cache, tables, lens) + 0).realize()

    for _ in range(4):
        q, cache, tables, lens = inputs(rng, 4)
        got = step(Tensor(q), Tensor(cache), Tensor(tables), Tensor(lens)).numpy()
        np.testing.assert_allclose(got, reference(q, cache, tables, lens), rtol=5e-6, atol=1e-5)


@pytest.mark.parametrize("start,T", [(0, 8), (5, 8), (13, 7)])
def test_prefill_is_causal_from_the_chunk_start(start, T):
    q, cache, tables, _ = inputs(np.random.default_rng(start), 1)
    q = np.random.default_rng(T).standard_normal((T, H, D)).astype(np.float32) * 3
    positions = np.arange(start, start + T, dtype=np.int32)
    got = cpu_paged_attention(Tensor(q), Tensor(cache), Tensor(tables), Tensor(np.zeros(T, np.int32)),
                              Tensor(positions), BS).numpy()
    rows = [reference(q[t:t + 1], cache, tables, np.array([min(start + t + 1, MAXB * BS)])) for t in range(T)]
    np.testing.assert_allclose(got, np.concatenate(rows), rtol=5e-6, atol=1e-5)


def test_a_flat_batch_of_chunks_and_decodes_of_several_sequences():
    """Tokens in any order: a prompt chunk of sequence 2, decodes of 0 and 1, a second chunk of sequence 0's table."""
    q_all, cache, tables, _ = inputs(np.random.default_rng(21), 3)
    rows = np.array([2, 2, 2, 0, 1, 0, 0], np.int32)
    positions = np.array([4, 5, 6, 19, 9, 0, 1], np.int32)
    q = np.random.default_rng(22).standard_normal((len(rows), H, D)).astype(np.float32) * 3
    got = cpu_paged_attention(Tensor(q), Tensor(cache), Tensor(tables), Tensor(rows), Tensor(positions), BS).numpy()
    expected = [reference(q[t:t + 1], cache, tables[rows[t]:rows[t] + 1], np.array([positions[t] + 1]))
                for t in range(len(rows))]
    np.testing.assert_allclose(got, np.concatenate(expected), rtol=5e-6, atol=1e-5)


def attend(kernel: str, q, cache, tables, rows, positions, spec, sinks=None):
    """The C kernel, or tinygrad's in-place attention over all of the tables' blocks: its scores kernel and weighted
    values ("in place", decode-sized steps), or its one fused kernel ("fused", prompt-sized steps)."""
    args = (Tensor(q), Tensor(cache), Tensor(tables), Tensor(rows), Tensor(positions))
    if kernel == "c":
        return cpu_paged_attention(*args, BS, spec=spec, sinks=sinks).numpy()
    return paged_attention_in_place(*args, tables.shape[1], BS, "float32", spec, sinks, fused=kernel == "fused").numpy()


@pytest.mark.parametrize("kernel", ["c", "in place", "fused"])
@pytest.mark.parametrize("window,softcap,with_sinks", [(0, 0.0, False), (6, 0.0, False), (0, 5.0, False),
                                                       (6, 0.0, True)])
def test_chunks_across_query_tiles_with_a_window_or_a_soft_cap(window, softcap, with_sinks, kernel):
    """A 19-token chunk (query tiles of 8, 8 and 3 tokens), a decode, then a 10-token chunk of another sequence;
    with_sinks: gpt-oss's attention sinks, one above the scores' range and one below."""
    _, cache, tables, _ = inputs(np.random.default_rng(31), 2)
    rows = np.array([0] * 19 + [1] + [1] * 10, np.int32)
    positions = np.concatenate([np.arange(1, 20), [3], np.arange(5, 15)]).astype(np.int32)
    q = np.random.default_rng(32).standard_normal((len(rows), H, D)).astype(np.float32) * 3
    spec = AttentionSpec(D ** -0.5, window, softcap)
    sinks = np.array([40.0, -40.0, 0.5, 3.0, -2.0, 10.0], np.float32) if with_sinks else None
    got = attend(kernel, q, cache, tables, rows, positions, spec, None if sinks is None else Tensor(sinks))
    expected = [reference(q[t:t + 1], cache, tables[rows[t]:rows[t] + 1], np.array([positions[t] + 1]), window,
                          softcap, sinks) for t in range(len(rows))]
    np.testing.assert_allclose(got, np.concatenate(expected), rtol=5e-6, atol=1e-5)


@pytest.mark.parametrize("kernel", ["c", "in place", "fused"])
def test_padding_and_blocks_freed_behind_a_window_stay_out_of_real_tokens(kernel):
    """A bucket's padding (row 0, position 0) right after a chunk of row 0 with a window, whose table no longer holds
    the blocks behind it (-1), and a value that overflowed to inf at the chunk's last position: the earlier tokens,
    which do not see it, stay finite and exact; the C kernel's padding reads nothing it may not (its outputs are
    zeros; the in-place kernels read a real block for a -1, whose positions no real token sees)."""
    window = 6
    _, cache, tables, _ = inputs(np.random.default_rng(41), 1)
    tables[0, :2] = -1  # positions 0-7: behind every real token's window (the first sees 9-14)
    chunk = np.arange(14, 19, dtype=np.int32)
    last_slot = tables[0, 18 // BS] * BS + 18 % BS
    cache[last_slot, 1] = np.inf
    rows, positions = np.zeros(8, np.int32), np.concatenate([chunk, np.zeros(3, np.int32)])
    q = np.random.default_rng(42).standard_normal((8, H, D)).astype(np.float32) * 3
    got = attend(kernel, q, cache, tables, rows, positions, AttentionSpec(D ** -0.5, window))
    expected = [reference(q[t:t + 1], cache, tables[:1], np.array([positions[t] + 1]), window) for t in range(4)]
    np.testing.assert_allclose(got[:4], np.concatenate(expected), rtol=5e-6, atol=1e-5)
    assert np.all(got[5:] == 0) if kernel == "c" else np.all(np.isfinite(got[5:]))


def test_supported_shapes():
    assert supports(9, 3, 64) and supports(32, 8, 128)
    assert not supports(9, 3, 40)  # head_dim not a multiple of 16


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_a_quantised_cache_read_in_place(dtype, fused):
    """tinygrad's in-place attention (both forms) over int8 / fp8 codes and their per-token scales equals the
    reference over the dequantised cache (workers/kv_quant.py): GPUs no longer gather a quantised cache."""
    from tinyvllm.workers.kv_quant import dequantize, quantize
    q, cache, tables, lens = inputs(np.random.default_rng(51), 3)
    codes, scales = (x.realize() for x in quantize(Tensor(cache), dtype))
    rows, positions = np.arange(3, dtype=np.int32), lens - 1  # one decode per sequence
    got = paged_attention_in_place(Tensor(q), codes, Tensor(tables), Tensor(rows), Tensor(positions), tables.shape[1],
                                   BS, dtype, AttentionSpec(D ** -0.5, 0, 0.0), fused=fused, scales=scales).numpy()
    expected = reference(q, dequantize(codes, scales, dtype).numpy(), tables, lens)
    np.testing.assert_allclose(got, expected, rtol=5e-6, atol=1e-5)
