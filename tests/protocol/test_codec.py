"""Every message type survives encode -> decode unchanged, and bad bytes are refused, never executed."""
import re

import msgpack
import pytest

from tinyvllm.protocol import messages as m
from tinyvllm.protocol.codec import MESSAGE_TYPES, CodecError, decode, encode
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.sampling import SamplingParams

SP = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=33, seed=-5, stop_token_ids=[7, 8], ignore_eos=True,
                    n=3, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1,
                    logit_bias_token_ids=[5, 9], logit_bias_values=[100.0, -2.5], min_tokens=2, logprobs=3,
                    prompt_logprobs=0)
LP = m.TokenLogprobs(5, -0.25, [5, 6], [-0.25, -1.5])
ENGINE = EngineConfig.of(num_kv_blocks=0, kv_cache_memory=1 << 30, block_size=16, max_num_seqs=16,
                         max_num_batched_tokens=512)
# every part of the tree away from its defaults (secrets are never sent: public() leaves them out)
FULL_ENGINE = EngineConfig.of(
    model="/m.gguf", max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=512, step_timeout_s=7.5,
    async_scheduling=False, block_size=32, kv_cache_memory=1 << 29, num_kv_blocks=100, swap_space=1 << 28,
    kv_cache_dir="/kv", kv_cache_dir_bytes=12345, kv_cache_dtype="int8", enable_prefix_caching=False,
    kernels="tinygrad", beam=2, jit_warmup=True, warmup_before_serving=True, tensor_parallel_size=2,
    pipeline_parallel_size=2, data_parallel_size=3, external_workers=True, worker_address="tcp://10.0.0.1:7000",
    worker_secret="w" * 32, transport="tcp", tcp_base_port=6000, role="prefill", kv_host="10.0.0.2", kv_port=5600,
    kv_lease_s=12.5, kv_secret="k" * 32, speculative_config={"method": "ngram", "num_speculative_tokens": 3}).public()

EXAMPLES = [
    m.AddRequest("r1", [1, 2, 3], SP, [2], 1700000000.5),
    m.AbortRequests(["r1", "r2"]),
    m.StepOutputs([m.RequestOutput("r1", [5], m.FinishReason.STOP, 3, 0, None, 0),
                   m.RequestOutput("r1", [6, 7], None, 3, 2, None, 2),
                   m.RequestOutput("r2", [], m.FinishReason.ERROR, 9, 0, "too long"),
                   m.RequestOutput("r3", [8], None, 4, 0, None, 0, queue_time_s=0.125),
                   m.RequestOutput("r3", [5], None, 2, 0, None, 0, [LP], [m.TokenLogprobs(8, -3.0)]),
                   m.RequestOutput("e1", [], m.FinishReason.STOP, 4, embedding=[0.5, -0.25, 0.0])],
                  m.SchedulerStats(2, 1, 10, 64, 7, 1200, 800, 3), 12.25),
    m.StepOutputs([], m.SchedulerStats(2, 0, 10, 64, 8, num_cached_free_blocks=4, running_requests=[
        m.RunningRequestSummary("cmpl-1", 12, 3, 1), m.RunningRequestSummary("chatcmpl-2", 40, 0, 3)]), 12.5),
    m.EngineReady(128, 16, 2048, 16, 1),
    m.EngineReady(128, 16, 2048, 16, 2, [70_000_000, 69_000_000]),
    m.EngineReady(128, 16, 2048, 16, 1, [70_000_000], "int8", "CUDA"),
    m.Shutdown("bye"),
    m.WorkerHello(0, 1, "both", 1234, "CPU"),
    m.WorkerHello(3, 4, "prefill", 1234, "CUDA:1", 2, 2, "tcp://10.0.0.2:6001"),
    m.WorkerHello(3, 4, "decode", 1234, "CUDA:1", 2, 2, "tcp://10.0.0.2:6001", "0.1.0",
                  "llama 30 layers #0123456789abcdef", [15, 30], bytes(range(32))),
    m.SchedulerChallenge(b"\x00" * 32, b"\xff" * 32),
    m.WorkerProof(b"\x01" * 32),
    m.WorkerRefused("another model"),
    m.KVReleased(0, ["cmpl-1"]),
    m.KVPull("cmpl-1", [3, 1, 4], "0123abcd {}", 1, b"\x00nonce", b"\xffmac"),
    m.KVBlockData("cmpl-1", 2, 3),
    m.KVBlockData("cmpl-1", 0, 3, "incompatible KV caches", b"mac"),
    m.KVRelease("cmpl-1"),
    m.KVRelease("cmpl-1", b"nonce", b"mac"),
    m.AddRequest("r9", [1, 2], SamplingParams(max_tokens=1, kv_transfer=m.KVTransferParams(True)), [2], 0.0),
    m.StepPlan(4, [], [], [], [], [m.KVLoad("r9", [7, 8], m.KVTransferParams(False, True, [1, 2], "e", "10.0.0.1", 5600,
                                                                           "r9", 1, 20))],
               [m.KVLease("r8", [3, 4])], ["r7", "r6"]),
    m.WorkerReady(0, 128, 16, 2048, 1, "tcp://127.0.0.1:5600"),
    m.InitWorker(ENGINE.serving(2048)),
    m.InitWorker(ENGINE.serving(2048), "engine-1", "ipc:///tmp/x/stage-2"),
    m.InitWorker(FULL_ENGINE, "engine-1", "ipc:///tmp/x/stage-2"),
    m.WorkerReady(0, 128, 16, 2048),
    m.WorkerReady(1, 128, 16, 2048, 56_000_000),
    m.StepPlan(3, [m.NewRequestData("r1", [1, 2, 3], SP, [4, 9], 0, 3),
                   m.NewRequestData("r2", [1, 2, 3, 4], SamplingParams(embed=True), [5], 2, 2, 3, [2, 7])],
               [m.CachedRequestData("r0", [11], 40, 1), m.CachedRequestData("r3", [], 7, 1, [], True)], ["old"],
               [[4, 12], [4, 13]]),
    m.StepResult(3, 0, ["r1", "r0"], [42, 43], 0.01),
    m.StepResult(4, 0, ["r1", "r0"], [5, 43], 0.02, [LP, None], [[m.TokenLogprobs(3, -1.0, [1], [-0.5])], None],
                 ["e1"], [[0.25, 0.5]]),
    m.StepResult(4, 0, ["r1"], [5], 0.02, more_parts=True),
    m.StepResult(5, 0, ["r1", "r0"], [5, 6], 0.02, accepted_draft_ids=[[3, 4], []],
                 proposed_draft_ids=[[7, 8, 9], []]),
    m.InitWorker(EngineConfig.of(num_kv_blocks=0, kv_cache_memory=1 << 30, block_size=16, max_num_seqs=16,
                                 max_num_batched_tokens=512,
                                 speculative_config='{"method": "draft_model", "model": "/m.gguf"}',
                                 max_model_len=2048)),
    m.WorkerError(1, "boom"),
]


def test_every_message_type_has_an_example():
    assert {type(e) for e in EXAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip(msg):
    assert decode(encode(msg)) == msg


def test_defaults_and_none_round_trip():
    msg = m.AddRequest("x", [1], SamplingParams())
    assert decode(encode(msg)) == msg


def test_new_fields_default_so_old_constructors_work():
    assert SamplingParams().n == 1
    assert m.RequestOutput("r", []).index == 0
    stats = m.SchedulerStats(1, 2, 3, 4, 5)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions) == (0, 0, 0)
    assert (stats.num_cached_free_blocks, stats.running_requests) == (0, [])
    assert m.StepPlan(1, [], [], []).block_copies == []
    out = m.RequestOutput("r", [])
    assert (out.logprobs, out.prompt_logprobs, out.embedding) == (None, None, None)
    result = m.StepResult(1, 0, [], [])
    assert (result.logprobs, result.prompt_logprobs, result.pooled_req_ids, result.embeddings) == ([], [], [], [])
    assert result.more_parts is False
    assert m.CachedRequestData("r", [], 1, 1).append_sampled is False
    new = m.NewRequestData("r", [1], SamplingParams(), [0], 0, 1)
    assert (new.num_prompt_tokens, new.eos_token_ids) == (0, [])
    sp = SamplingParams()
    assert (sp.min_p, sp.repetition_penalty, sp.logit_bias, sp.min_tokens, sp.logprobs, sp.embed) == \
        (0.0, 1.0, {}, 0, None, False)


@pytest.mark.parametrize("n, ok", [(0, False), (1, True), (128, True), (129, False)])
def test_n_is_validated(n, ok):
    if ok:
        SamplingParams(n=n).validate()
    else:
        with pytest.raises(ValueError, match="n must be"):
            SamplingParams(n=n).validate()


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", msgpack.packb([99, []]), msgpack.packb(["AddRequest", []]), msgpack.packb([0, ["r", [1], "not params"]]),
    msgpack.packb([1, [[1, 2]]]),  # AbortRequests with ints for ids
    msgpack.packb([1, [["a"], "extra"]]),  # too many fields
    msgpack.packb([0, ["r", [True], [1.0, 1.0, 0, 16, None, [], False, 1], [], 0.0]]),  # bool is not a token id
    msgpack.packb([0, ["r", [1], [1.0, 1.0, 0, 16, None, [], False], [], 0.0]]),  # SamplingParams without n
])
def test_malformed_messages_are_refused(payload):
    with pytest.raises(CodecError):
        decode(payload)


def test_non_protocol_objects_are_not_encoded():
    with pytest.raises(CodecError):
        encode({"not": "a message"})


def test_oversized_message_is_refused(monkeypatch):
    import tinyvllm.protocol.codec as codec
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 10)
    with pytest.raises(CodecError):
        decode(encode(m.AbortRequests(["a" * 100])))


@pytest.mark.parametrize("kwargs, message", [
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": -3}, "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero"),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens must be less than or equal to max_tokens=4"),
    ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"prompt_logprobs": -1}, "prompt_logprobs must be non-negative"),
])
def test_new_sampling_fields_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(**kwargs).validate()


def test_logit_bias_is_clamped():
    sp = SamplingParams()
    sp.set_logit_bias({3: 250.0, 4: -1e9, 5: 1.5})
    assert sp.logit_bias == {3: 100.0, 4: -100.0, 5: 1.5}
