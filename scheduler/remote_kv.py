"""Disaggregated prefill/decode in the scheduler (vLLM's KV connector contract, scheduler side).

Prefill side: a request that came with kv_transfer.do_remote_decode does not free its blocks when it finishes: they go
under a lease (KVLeases) until every worker reported that a decode worker took them (KVReleased), or until the lease
runs out; its last output carries the KVTransferParams that tell a decode instance where to pull them from.

Decode side: a request that came with kv_transfer.do_remote_prefill is admitted with blocks for its whole prompt and
waits (RequestStatus.WAITING_FOR_REMOTE_KV) while a step's kv_loads has the workers pull the remote blocks into the
first of them; once the result says they are in, it runs as if all but its last prompt token were computed (they
count as cached tokens), so only that token is computed here, and it samples. A failed pull ends it with an error.
"""
import time
from collections import OrderedDict

from tinyvllm.protocol.kv_compat import tokens_hash
from tinyvllm.protocol.messages import FinishReason, KVLease, KVLoad, KVTransferParams, StepPlan, StepResult
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.request import Request, RequestStatus


class KVLeases:
    """Blocks held for a decode instance to pull: req_id -> (deadline, block ids, ranks that still hold them)."""

    def __init__(self, lease_s: float, world_size: int = 1, clock=time.monotonic):
        self.lease_s, self.world_size, self.clock = lease_s, world_size, clock
        self._leases: OrderedDict[str, tuple[float, list[int], set[int]]] = OrderedDict()  # oldest first
        self.num_expired = 0

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._leases

    def block_tables(self) -> list[list[int]]:
        return [block_ids for _, block_ids, _ in self._leases.values()]

    def hold(self, req_id: str, block_ids: list[int]) -> list[int]:
        """Leases block_ids under req_id; returns the blocks of an earlier lease under the same id (to free)."""
        old = self._leases.pop(req_id, None)
        self._leases[req_id] = (self.clock() + self.lease_s, list(block_ids), set(range(self.world_size)))
        return old[1] if old else []

    def release(self, req_id: str, rank: int) -> list[int]:
        """Rank `rank` is done with req_id's blocks; returns them once every rank is (else [])."""
        lease = self._leases.get(req_id)
        if lease is None:
            return []
        lease[2].discard(rank)
        if lease[2]:
            return []
        del self._leases[req_id]
        return lease[1]

    def expire(self) -> dict[str, list[int]]:
        """req_id -> blocks of every lease past its deadline (each lease is as long, so the oldest go first)."""
        now, expired = self.clock(), {}
        while self._leases and next(iter(self._leases.values()))[0] <= now:
            req_id, (_, block_ids, _) = self._leases.popitem(last=False)
            expired[req_id] = block_ids
            self.num_expired += 1
        return expired


class RemoteKV:
    """The scheduler's remote KV: admission checks, the decode side's pulls (`loading`) and the prefill side's leases,
    over the scheduler's block manager; the scheduler moves the requests between its own queues."""

    def __init__(self, kv_cache_manager: KVCacheManager, lease_s: float, world_size: int = 1):
        self.kv_mgr = kv_cache_manager
        self.leases = KVLeases(lease_s, world_size)
        self.side_channel: KVTransferParams | None = None  # engine id, host, port, tp size of this prefill engine
        self.takes_remote_prefill = False  # a decode engine (serve --role decode)
        self.loading: list[Request] = []  # WAITING_FOR_REMOTE_KV, in admission order
        self._new_loads: list[KVLoad] = []  # for the next plan
        self.num_remote_tokens = 0  # cumulative: prompt tokens whose KV came from a prefill instance
        self._ended: list[str] = []  # leases the workers may hold and must drop (the next plan says so)
        self._handed_out: set[str] = set()  # decode requests whose pull went to the workers (they release it)
        self._abandoned: list[KVTransferParams] = []  # remote KV nobody will pull: scheduler/main.py releases it

    # ---- admission -----------------------------------------------------------------------------------

    def admission_error(self, req: Request) -> str | None:
        kv = req.kv_transfer
        if kv is None:
            return None
        if kv.do_remote_decode and self.side_channel is None:
            return "kv_transfer_params.do_remote_decode: this instance has no KV side channel (serve --role prefill)"
        if kv.do_remote_decode and req.sampling.max_tokens != 1:
            return "kv_transfer_params.do_remote_decode needs max_tokens 1: the decode instance generates the rest"
        if kv.do_remote_prefill and not self.takes_remote_prefill:
            return "kv_transfer_params.do_remote_prefill: this instance does not pull KV (serve --role decode)"
        if (kv.do_remote_decode or kv.do_remote_prefill) and req.sampling.n > 1:
            return "kv_transfer_params with n > 1 is not supported"
        if kv.do_remote_prefill and req.needs_every_position:
            return "kv_transfer_params.do_remote_prefill with prompt logprobs: they need the prompt computed here"
        if kv.do_remote_prefill:
            bs = self.kv_mgr.block_size
            kv.remote_num_tokens = kv.remote_num_tokens or req.num_prompt_tokens - 1  # not given: all but the last
            if kv.remote_num_tokens != req.num_prompt_tokens - 1:
                return (f"kv_transfer_params: the remote KV holds {kv.remote_num_tokens} tokens, this prompt needs "
                        f"{req.num_prompt_tokens - 1} (not the prompt the prefill instance computed?)")
            if len(kv.remote_block_ids) != self.kv_mgr.blocks_for_tokens(kv.remote_num_tokens):
                return (f"kv_transfer_params: {len(kv.remote_block_ids)} remote blocks for {kv.remote_num_tokens} tokens "
                        f"in blocks of {bs} (a different block size on the prefill instance?)")
            if not kv.remote_host or not kv.remote_port:
                return "kv_transfer_params: remote_host and remote_port are required with do_remote_prefill"
            if kv.remote_port + max(1, kv.tp_size) - 1 > 65535:
                return "kv_transfer_params: remote_port + tp_size - 1 is past port 65535"
        return None

    def refused(self, req: Request) -> None:
        """req was refused at admission: if it came for remote KV, nobody will pull that (release it now)."""
        kv = req.kv_transfer
        if kv is not None and kv.do_remote_prefill and self.takes_remote_prefill and kv.remote_host and \
                kv.remote_port and kv.remote_port + max(1, kv.tp_size) - 1 <= 65535:
            self._abandoned.append(kv)

    def preempted(self, req: Request) -> None:
        """A preempted prefill's blocks go back to the pool: the workers must stop serving them (a plan may have
        leased them already); the step that completes its prompt again leases its new blocks."""
        if self.leaves_kv(req):
            self._ended.append(req.req_id)

    def needs_load(self, req: Request) -> bool:
        kv = req.kv_transfer
        return (kv is not None and kv.do_remote_prefill and kv.remote_num_tokens > 0 and req.num_computed_tokens == 0
                and not req.output_token_ids and req.num_preemptions == 0)

    def start_load(self, req: Request) -> bool:
        """Admits a waiting request whose prompt KV is remote: blocks for the whole prompt, and a load for the next
        plan. False when the blocks are not free (it stays first in the queue)."""
        if not self.kv_mgr.admit(req, [], req.num_prompt_tokens):
            return False
        kv = req.kv_transfer
        req.status = RequestStatus.WAITING_FOR_REMOTE_KV
        if req.queue_time_s is None and req.arrival_time > 0:
            req.queue_time_s = max(0.0, time.time() - req.arrival_time)
        self.loading.append(req)
        self._new_loads.append(KVLoad(req.req_id, req.block_ids[:len(kv.remote_block_ids)], kv,
                                      tokens_hash(req.prompt_token_ids[:kv.remote_num_tokens])))
        return True

    def take_new_loads(self) -> list[KVLoad]:
        loads, self._new_loads = self._new_loads, []
        still_loading = {req.req_id for req in self.loading}  # not aborted meanwhile
        loads = [load for load in loads if load.req_id in still_loading]
        self._handed_out.update(load.req_id for load in loads)
        return loads

    def take_abandoned(self) -> list[KVTransferParams]:
        abandoned, self._abandoned = self._abandoned, []
        return abandoned

    # ---- results -------------------------------------------------------------------------------------

    def take_loaded(self, result: StepResult) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Takes the requests whose pull the result reports out of `loading`: (those whose KV arrived, now RUNNING
        with all but their last prompt token computed and cached, for the scheduler to run; (request, reason) for
        those whose pull failed, for it to end)."""
        by_id = {req.req_id: req for req in self.loading}
        arrived = []
        for req_id in result.kv_loaded_req_ids:
            if (req := by_id.get(req_id)) is None:
                continue  # aborted meanwhile
            self.loading.remove(req)
            n = req.kv_transfer.remote_num_tokens
            req.status, req.num_computed_tokens, req.num_cached_tokens = RequestStatus.RUNNING, n, n
            self.num_remote_tokens += n
            self.kv_mgr.cache_computed_blocks(req)
            arrived.append(req)
        failed = []
        for req_id, reason in zip(result.kv_failed_req_ids, result.kv_failed_reasons):
            if (req := by_id.get(req_id)) is None:
                continue
            self.loading.remove(req)
            failed.append((req, reason))
        return arrived, failed

    # ---- finish and leases ---------------------------------------------------------------------------

    def leaves_kv(self, req: Request) -> bool:
        kv = req.kv_transfer
        return kv is not None and kv.do_remote_decode and self.side_channel is not None and req.num_prompt_tokens >= 2

    def add_leases(self, plan: StepPlan, scheduled: list[tuple[Request, int, int]]) -> None:
        """The workers serve a prompt's blocks once the step that completes it ran (before its result, and so its
        output, exists); the plan's kv_leases_ended makes them stop before any later step writes those blocks."""
        for req, start, num_new in scheduled:
            if self.leaves_kv(req) and start < req.num_prompt_tokens <= start + num_new:
                n = req.num_prompt_tokens - 1
                plan.kv_leases.append(KVLease(req.req_id, req.block_ids[:self.kv_mgr.blocks_for_tokens(n)],
                                              tokens_hash(req.prompt_token_ids[:n])))
        plan.kv_leases_ended, self._ended = self._ended, []

    def free_or_lease(self, req: Request, reason: str) -> None:
        """Frees req's blocks, unless it is a finished prefill for a remote decode: those go under a lease and its
        outputs from now on carry where to pull them from."""
        kv = req.kv_transfer
        if kv is not None and kv.do_remote_prefill and req.req_id not in self._handed_out and kv.remote_num_tokens:
            self._abandoned.append(kv)  # ended (say, aborted) while it waited for its pull
        self._handed_out.discard(req.req_id)
        if not self.leaves_kv(req) or reason not in (FinishReason.STOP, FinishReason.LENGTH):
            if self.leaves_kv(req):
                self._ended.append(req.req_id)
            self.kv_mgr.free(req)
            return
        n = req.num_prompt_tokens - 1
        num_blocks = self.kv_mgr.blocks_for_tokens(n)
        sc = self.side_channel
        req.kv_transfer_out = KVTransferParams(False, True, req.block_ids[:num_blocks], sc.remote_engine_id,
                                               sc.remote_host, sc.remote_port, req.req_id, sc.tp_size, n)
        self.kv_mgr.pool.release(reversed(req.block_ids[num_blocks:]))  # the rest (the last token's) is not pulled
        self.kv_mgr.pool.release(reversed(self.leases.hold(req.req_id, req.block_ids[:num_blocks])))
        req.block_ids, req.num_registered_blocks = [], 0

    def release(self, req_ids: list[str], rank: int) -> None:
        for req_id in req_ids:
            if freed := self.leases.release(req_id, rank):
                self._ended.append(req_id)
                self.kv_mgr.pool.release(reversed(freed))

    def expire_leases(self) -> bool:
        """True when leases ran out (their blocks are free now)."""
        expired = self.leases.expire() if len(self.leases) else {}
        self._ended += expired.keys()
        self.kv_mgr.pool.release(reversed([b for blocks in expired.values() for b in blocks]))
        return bool(expired)
