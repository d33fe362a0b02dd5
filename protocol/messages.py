"""Every message that crosses a process boundary. The wire format is fixed by protocol.codec.

Frontend -> scheduler:  AddRequest, AbortRequests, Shutdown
Scheduler -> frontend:  EngineReady, StepOutputs
Worker -> scheduler:    WorkerHello, WorkerProof (handshake), WorkerReady, StepResult, WorkerError
Scheduler -> worker:    SchedulerChallenge, WorkerRefused (handshake), InitWorker, StepPlan, Shutdown
Worker -> scheduler:    KVReleased (a prefill worker: a decode worker took a request's KV, or gave up on it)
Worker <-> worker:      KVPull -> KVBlockData... (decode pulls a prefill worker's blocks), KVRelease (the side
                        channel, workers/kv_side_channel.py; each KVBlockData is followed by one raw frame); a decode
                        scheduler sends KVRelease too, for a request that ended before its pull
"""
from dataclasses import dataclass, field

from tinyvllm.protocol.batch_summary import RunningRequestSummary
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.handshake_messages import (SchedulerChallenge, WorkerHello, WorkerProof,  # noqa: F401
                                                  WorkerRefused)  # (re-exported)
from tinyvllm.protocol.kv_messages import (KVBlockData, KVDiskBlock, KVLease, KVLoad, KVPull,  # noqa: F401 (re-exported)
                                           KVRelease, KVReleased)
from tinyvllm.protocol.sampling import KVTransferParams, SamplingParams  # noqa: F401 (KVTransferParams: re-exported)


class FinishReason:
    STOP = "stop"      # EOS or a stop token id
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"    # client went away, or aborted on request
    ERROR = "error"    # the engine could not serve it (message in RequestOutput.error, kind in error_kind)


class ErrorKind:
    """Why a request ended with FinishReason.ERROR, so the frontend answers the right HTTP status."""
    INVALID_REQUEST = "invalid_request"  # the engine refused it as asked (400)
    ENGINE_FAILURE = "engine_failure"    # the engine failed while serving it (500)
    UNAVAILABLE = "unavailable"          # the engine died, restarts, or the server is shutting down (503)
    TIMEOUT = "timeout"                  # it did not finish within --request-timeout (504)


# ---- frontend <-> scheduler -------------------------------------------------

@dataclass(slots=True)
class AddRequest:
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: list[int] = field(default_factory=list)
    arrival_time: float = 0.0


@dataclass(slots=True)
class AbortRequests:
    req_ids: list[str]


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities at one position under the raw model distribution (log_softmax of the logits, before
    penalties, biases or temperature, as vLLM's default raw_logprobs): the chosen (sampled or prompt) token's,
    and the top_token_ids' (most likely first)."""
    token_id: int
    logprob: float
    top_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass(slots=True)
class RequestOutput:
    """The tokens one request gained in one step (a delta), and how it ended if it did."""
    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (set on every output of the request)
    error: str | None = None
    index: int = 0  # parallel sampling (n > 1): which child of req_id this is
    logprobs: list[TokenLogprobs] | None = None  # one per new token, when sampling.logprobs is set
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., once, with the first token
    embedding: list[float] | None = None  # an embedding request's vector, a scoring request's logits (sampling.pools)
    queue_time_s: float | None = None  # seconds from arrival to first scheduling, once the request was scheduled
    error_kind: str | None = None  # an ErrorKind, with FinishReason.ERROR
    kv_transfer: KVTransferParams | None = None  # a prefill instance's answer: where the prompt's blocks wait


@dataclass(slots=True)
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    step_id: int = 0
    # Cumulative, in tokens: looked up in the prefix cache at admission (and at resume), and found there.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0  # cumulative
    num_tokens_computed: int = 0  # cumulative: tokens whose KV the workers computed (prefill, recompute, decode)
    # CPU swap (--swap-space): free and total host slots of one block each, and blocks copied out and back in.
    num_free_swap_slots: int = 0
    num_swap_slots: int = 0
    num_swapped_out_blocks: int = 0  # cumulative
    num_swapped_in_blocks: int = 0  # cumulative
    # Speculative decoding (cumulative): steps that verified drafts for a request, the drafts proposed, those
    # accepted, and those accepted at each draft position (index 0: the first draft).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    num_cached_free_blocks: int = 0  # free blocks that still hold prefix-cache content (revived on a hit)
    running_requests: list[RunningRequestSummary] = field(default_factory=list)  # bounded: protocol/batch_summary.py
    # --enable-lora (vllm:lora_requests_info): the adapter slots, and the adapters of running and waiting requests
    max_loras: int = 0
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)

    @property
    def kv_usage(self) -> float:
        if self.num_total_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    @property
    def swap_usage(self) -> float:
        if self.num_swap_slots == 0:
            return 0.0
        return 1.0 - self.num_free_swap_slots / self.num_swap_slots


@dataclass(slots=True)
class StepOutputs:
    outputs: list[RequestOutput]
    stats: SchedulerStats
    timestamp: float = 0.0


@dataclass(slots=True)
class EngineReady:
    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    num_workers: int
    worker_weight_bytes: list[int] = field(default_factory=list)  # by rank: the weights each worker holds
    kv_cache_dtype: str = "float32"  # what the KV cache stores (auto resolved)
    device: str = ""  # the workers' tinygrad device (rank 0's), e.g. CPU or CUDA


@dataclass(slots=True)
class Shutdown:
    reason: str = ""


# ---- scheduler <-> workers --------------------------------------------------

@dataclass(slots=True)
class InitWorker:
    """Sent by the scheduler once every expected worker joined (said hello and proved it knows the secret)."""
    # the scheduler's (no secrets): the cache's size and dtype, the batch limits, speculation, the context served
    engine: EngineConfig
    group_id: str = ""  # names the tensor-parallel groups' shared memory (each stage's group adds its stage)
    next_stage_address: str = ""  # where this worker sends its hidden states (a stage before the last)


@dataclass(slots=True)
class WorkerReady:
    rank: int
    num_blocks: int
    block_size: int
    max_model_len: int
    weight_bytes: int = 0  # the weights this worker holds on its device (its shard)
    kv_address: str = ""  # a prefill worker's KV side channel, tcp://host:port (disaggregated serving)
    num_swap_slots: int = 0  # blocks its swap space holds (swap_space_bytes over its shard of a block)
    # --kv-cache-dir: the folder this worker's block files go to (its model, dtype and parallel layout's), and the
    # bytes of one block's file; "" and 0 without a persistent prefix cache.
    kv_disk_dir: str = ""
    kv_disk_block_bytes: int = 0
    kv_cache_dtype: str = "float32"  # what its cache stores (--kv-cache-dtype auto resolved for its device and kernels)


@dataclass(slots=True)
class NewRequestData:
    """A request the worker has not seen: sent in full, once."""
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    # How many of prompt_token_ids are the prompt (a resumed request also sends its outputs so far); 0: all.
    num_prompt_tokens: int = 0
    eos_token_ids: list[int] = field(default_factory=list)  # masked, with stop_token_ids, until min_tokens


@dataclass(slots=True)
class CachedRequestData:
    """A request the worker already holds: only what changed."""
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    # The tokens it gained since the workers last saw it (sampled by the worker that samples), appended before
    # this step's positions: every worker (each tensor- and pipeline-parallel shard) learns them from the plan.
    new_token_ids: list[int] = field(default_factory=list)
    # Async scheduling (one worker only): the step was planned before the previous step's result was in, so its
    # first position holds the token the worker sampled for this request in that step. The worker appends it
    # itself, after new_token_ids; no later plan sends it.
    append_sampled: bool = False
    # Speculative decoding: tokens proposed to follow the request's known tokens (scheduler/spec_decode.py). The
    # step computes them after its known tokens, verifies them (workers/spec_verify.py) and forgets them.
    draft_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class StepPlan:
    step_id: int
    new_reqs: list[NewRequestData]
    cached_reqs: list[CachedRequestData]
    finished_req_ids: list[str]
    # Copy-on-write: [src, dst] block pairs; workers copy each block's keys and values in every layer, in
    # this order, before computing the step (after applying finished_req_ids).
    block_copies: list[list[int]] = field(default_factory=list)
    # Disaggregated decode: KV to pull from prefill workers into local blocks, before computing the step.
    kv_loads: list[KVLoad] = field(default_factory=list)
    # Disaggregated prefill: blocks this step's prompts leave for decode instances to pull (a worker's side channel
    # serves only those), and leases that ended since the last plan (released, expired, or never taken).
    kv_leases: list[KVLease] = field(default_factory=list)
    kv_leases_ended: list[str] = field(default_factory=list)
    # CPU swap (scheduler/swap.py): [block, slot] pairs copied to host memory before the block copies, and [slot,
    # block] pairs copied back after them; both before computing the step.
    swap_out: list[list[int]] = field(default_factory=list)
    swap_in: list[list[int]] = field(default_factory=list)
    # Persistent prefix cache (--kv-cache-dir, scheduler/disk_kv.py): blocks to write to disk, read before the step
    # (they are full and computed; the step may reuse them); files to delete, after those writes; blocks to fill from
    # disk, after the step (no request of the step holds them).
    kv_disk_saves: list[KVDiskBlock] = field(default_factory=list)
    kv_disk_deletes: list[bytes] = field(default_factory=list)
    kv_disk_loads: list[KVDiskBlock] = field(default_factory=list)


@dataclass(slots=True)
class StepResult:
    """Sampled tokens for the requests whose scheduled tokens reached the end of their known tokens (embedding
    requests: their vectors instead)."""
    step_id: int
    rank: int
    req_ids: list[str]
    sampled_token_ids: list[int]
    elapsed_s: float = 0.0
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # by req_ids; empty: no row asked
    prompt_logprobs: list[list[TokenLogprobs] | None] = field(default_factory=list)  # by req_ids; empty: none
    # Embedding and scoring requests that finished their prompt this step, and their vectors (SamplingParams.pools).
    pooled_req_ids: list[str] = field(default_factory=list)
    embeddings: list[list[float]] = field(default_factory=list)
    # Another part of this step's result follows: a result over the message bound goes in several, split by rows
    # (protocol/message_parts.py), and the scheduler merges them.
    more_parts: bool = False
    # The step's kv_loads: done, and failed (with a reason each); a failed request ends with an explicit error.
    kv_loaded_req_ids: list[str] = field(default_factory=list)
    kv_failed_req_ids: list[str] = field(default_factory=list)
    kv_failed_reasons: list[str] = field(default_factory=list)
    # The step's kv_disk_loads that failed on any rank (a missing, corrupt or foreign file): not loaded.
    kv_disk_failed_block_ids: list[int] = field(default_factory=list)
    # Requests the worker could not run this step (a LoRA adapter it could not read), with why: not computed, and
    # they end with an error.
    failed_req_ids: list[str] = field(default_factory=list)
    failed_reasons: list[str] = field(default_factory=list)
    # Speculative decoding, by req_ids (empty: no row had drafts): the leading drafts the target model accepted.
    # A row's new tokens are its accepted drafts, then its sampled token.
    accepted_draft_ids: list[list[int]] = field(default_factory=list)
    # Draft-model speculation, by req_ids (empty: no row proposed): the draft model's greedy tokens to follow each
    # row's new tokens (workers/draft_model.py), the drafts of its next step.
    proposed_draft_ids: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class WorkerError:
    rank: int
    message: str
