"""One request as the scheduler tracks it: its tokens, how far the KV cache has caught up, its blocks."""
import enum
from dataclasses import dataclass, field

from tinyvllm.protocol.messages import AddRequest, FinishReason, KVTransferParams
from tinyvllm.protocol.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"    # queued, or preempted and holding no blocks (but maybe swap slots: scheduler/swap.py)
    WAITING_FOR_FORK = "waiting_for_fork"  # a parallel-sampling child: waits for its leader to prefill the prompt
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # holds blocks; its prompt's KV is being pulled (remote_kv.py)
    RUNNING = "running"    # admitted: holds blocks, scheduled every step until it finishes or is preempted
    FINISHED = "finished"  # done for good (finish_reason says why); holds no blocks


# eq=False: requests compare by identity (they are removed from queues by identity, and two may look alike).
@dataclass(slots=True, eq=False)
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: list[int] = field(default_factory=list)
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is in the cache. It chases num_tokens: the gap is what the next step computes.
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    # Hook for a cache salt: mixed into the first block's hash, so only requests with the same salt share blocks.
    cache_salt: str | None = None
    # Parallel sampling: outputs go out under the parent's id with this child's index.
    parent_id: str | None = None
    index: int = 0
    # A leader's siblings, until it has computed all but its last prompt token and they fork off its blocks.
    pending_forks: list["Request"] = field(default_factory=list)
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache supplied at first admission
    queue_time_s: float | None = None  # arrival to first admission (vllm:request_queue_time_seconds)
    # Prefix-cache bookkeeping (scheduler.kv_cache_manager): hashes of full blocks, and how many leading
    # blocks of block_ids are known to be registered in the cache.
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0
    num_freed_blocks: int = 0  # leading entries of block_ids given back behind a sliding window (FREED)
    swap_slots: list[int] = field(default_factory=list)  # preempted by swapping: host slots holding its computed KV
    looked_up_disk: bool = False  # the persistent prefix cache was asked once for its prefix (scheduler/disk_kv.py)
    kv_transfer: KVTransferParams | None = None  # disaggregated prefill/decode, as asked (scheduler/remote_kv.py)
    kv_transfer_out: KVTransferParams | None = None  # a prefill's answer: where its leased blocks are
    draft_token_ids: list[int] = field(default_factory=list)  # proposed for its step in flight (spec_decode.py)
    # Draft-model speculation: the worker's proposals to follow its first proposed_for tokens (spec_decode.py)
    proposed_draft_ids: list[int] = field(default_factory=list)
    proposed_for: int = -1

    def __post_init__(self):
        if self.cache_salt is None and self.sampling.lora is not None:  # an adapter's keys and values are its own
            self.cache_salt = f"lora:{self.sampling.lora.key}"

    @classmethod
    def from_add_request(cls, msg: AddRequest) -> "Request":
        req = cls(msg.req_id, list(msg.prompt_token_ids), msg.sampling, list(msg.eos_token_ids), msg.arrival_time)
        req.kv_transfer = msg.sampling.kv_transfer
        return req

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def output_id(self) -> str:
        """The id the frontend knows: the parent's for a parallel-sampling child."""
        return self.req_id if self.parent_id is None else self.parent_id

    @property
    def compute_limit(self) -> int:
        """How far num_computed_tokens may go: a leader stops short of its last prompt token until it forks."""
        return self.num_prompt_tokens - 1 if self.pending_forks else self.num_tokens

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building all_token_ids."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt:end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - num_prompt]

    @property
    def needs_every_position(self) -> bool:
        """Prompt logprobs and embeddings need every prompt position computed: no prefix-cache hits, no forks."""
        return self.sampling.prompt_logprobs is not None or self.sampling.embed

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def stop_reason(self, max_len: int) -> str | None:
        """Why the request must stop after its newest token, or None to go on.

        A stop token wins over a length cap hit on the same token: the model did choose to stop.
        The stop token itself stays in output_token_ids (it counts as a completion token, as in vLLM).
        Before min_tokens only the length caps apply (the worker masks stop tokens until then anyway).
        """
        if self.num_output_tokens >= self.sampling.min_tokens:
            last = self.output_token_ids[-1]
            if not self.sampling.ignore_eos and last in self.eos_token_ids:
                return FinishReason.STOP
            if last in self.sampling.stop_token_ids:
                return FinishReason.STOP
        if self.num_output_tokens >= self.sampling.max_tokens or self.num_tokens >= max_len:
            return FinishReason.LENGTH
        return None
