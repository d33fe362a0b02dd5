"""Start-up capture: warm_up captures every token bucket's forward (and the plain greedy and sampling variants of
the sampler for every row bucket) without touching a live KV block, and the captured steps then compute what the dense reference does."""
import numpy as np
import pytest
from tinygrad.uop.ops import Ops

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tests.workers.dense_reference import dense_logits, random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner, buckets_up_to
from tinyvllm.workers.sampling_batch import SamplerVariant

BLOCK_SIZE, NUM_BLOCKS = 4, 16


@pytest.fixture(scope="module")
def warmed(module_kernel_set):
    weights = random_llama(CFG, seed=11)
    weights["output.weight"] = np.random.default_rng(12).standard_normal((CFG.vocab_size, CFG.dim)).astype(np.float32) * 0.3
    runner = ModelRunner(Transformer(CFG, weights, CFG.max_context, kernels=module_kernel_set), PagedKVCache(CFG, NUM_BLOCKS, BLOCK_SIZE),
                         max_num_seqs=2, max_model_len=32, max_num_batched_tokens=8)
    seen = []
    count = runner.warm_up(lambda done, total, what: seen.append((done, total, what)))
    return weights, runner, count, seen


def test_every_bucket_is_captured_before_the_first_request(warmed):
    _, runner, count, seen = warmed
    assert runner.token_buckets == [1, 2, 4, 8] and runner.row_buckets == [1, 2]
    assert count == 4 and seen == [(1, 4, "tokens 1"), (2, 4, "tokens 2"), (3, 4, "tokens 4"), (4, 4, "tokens 8")]
    assert all(jit.captured is not None for jit in runner.forward_jits.values())
    for bucket in runner.row_buckets:
        for greedy in (True, False):
            assert runner.sampler.jits[(bucket, SamplerVariant(greedy, False, None))].captured is not None


def test_token_buckets_from_256_have_one_halfway_to_the_next(warmed):
    """A step is padded to its token bucket: with powers of two alone a 259-token step computed 512 rows."""
    weights, runner, _, _ = warmed
    wide = ModelRunner(runner.model, runner.cache, max_num_seqs=2, max_model_len=32, max_num_batched_tokens=512)
    assert wide.token_buckets == [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512]
    assert buckets_up_to(2048, 256)[-5:] == [512, 768, 1024, 1536, 2048] and buckets_up_to(300, 128)[-3:] == [192, 256, 300]
    assert wide.row_buckets == [1, 2]


def test_warm_up_writes_only_the_scratch_block(warmed):
    _, runner, _, _ = warmed
    live_slots = runner.cache.scratch_slot  # every slot before the scratch block belongs to a real block
    for layer in runner.cache.layers:
        assert not np.any(layer.numpy()[:live_slots])


def test_captured_steps_compute_the_dense_model(warmed):
    weights, runner, _, _ = warmed
    prompts = [[5, 17, 3, 88, 41, 9], [60, 2, 33]]
    greedy = SamplingParams(temperature=0, max_tokens=4)
    new = [NewRequestData(f"r{i}", p, greedy, [2 * i, 2 * i + 1, 8 + i], 0, len(p)) for i, p in enumerate(prompts)]
    outputs = [list(p) for p in prompts]
    result = runner.execute(StepPlan(1, new, [], []))
    for step in range(2, 5):
        for req_id, token in zip(result.req_ids, result.sampled_token_ids):
            outputs[int(req_id[1])].append(token)
        cached = [CachedRequestData(f"r{i}", [], len(o) - 1, 1, [o[-1]]) for i, o in enumerate(outputs)]
        result = runner.execute(StepPlan(step, [], cached, []))
    for seq in outputs:  # each sampled token is the dense model's argmax after the tokens before it
        for t in range(len(seq) - 3, len(seq)):
            assert seq[t] == int(dense_logits(CFG, weights, seq[:t])[-1].argmax())


def kernel_calls(jit):
    """The captured step's kernel calls, those batched into a graph (workers/cpu_graph.py) included."""
    for call in jit.captured.linear.src:
        if call.src[0].op is Ops.CUSTOM_FUNCTION and call.src[0].arg == "graph":
            yield from call.src[0].src[0].src
        else:
            yield call


def calls_named(jit, *prefixes: str) -> int:
    return sum(1 for call in kernel_calls(jit)
               if call.src[0].op is Ops.PROGRAM and call.src[0].src[0].arg.name.startswith(prefixes))


def test_each_captured_step_runs_every_layer_once(warmed):
    """The logits and the KV-cache writes are realized in one schedule: realized apart, the layers ran twice."""
    _, runner, _, _ = warmed
    per_layer = 7  # q, k, v, output, gate, up, down
    for bucket, jit in runner.forward_jits.items():
        assert calls_named(jit, "write_kv") == CFG.n_layers, bucket
        if runner.model.kernels.matmul == "c":  # tinygrad's own matmuls are fused kernels with generated names
            assert calls_named(jit, "matmul_", "matvec_", "gemm_") == CFG.n_layers * per_layer + 1, bucket  # + logits


def test_the_warm_up_ends_tinygrads_compile_processes(warmed):
    """The pool of processes tinygrad compiles new steps in (PARALLEL of them, ~25 MB each) would idle for the
    server's whole life once every bucket is captured."""
    from tinygrad.engine import worker
    from tinygrad.helpers import Context
    _, runner, _, _ = warmed
    with Context(PARALLEL=1):
        assert worker.get_worker_pool() is not None  # as a step's compile starts it
    runner.finish_warm_up()
    assert worker.worker_pool is None
