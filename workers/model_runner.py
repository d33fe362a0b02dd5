"""Runs one StepPlan on the model: prepare -> one forward -> sample.

Every scheduled token of the step — decodes and prompt chunks of many requests — goes through one jitted forward
over a flat token batch (workers/flat_batch.py), one TinyJit per token-count bucket; the forward also computes the
logits of each row that samples (a chunk that reaches the end of its request's known tokens), and one jitted
sampler call picks their tokens. Two features read more than those rows, from the forward's final hidden states:
embeddings (summed per request on the host) and prompt logprobs (a jitted head over every position, compiled
only when first asked for).
"""
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from tinygrad import Tensor, TinyJit, UOp, dtypes
from tinygrad.engine.worker import terminate_worker_pool

from tinyvllm.protocol.lora_adapter import LoRAError
from tinyvllm.protocol.messages import StepPlan, StepResult
from tinyvllm.protocol.parallel_layout import ShardSpec
from tinyvllm.protocol.sampling import MAX_SCORE_TOKENS
from tinyvllm.workers.attention import PagedAttention
from tinyvllm.workers.batch_state import BatchState, ScheduledChunk
from tinyvllm.workers.device_input import HostInputs, device_tensor, host_array
from tinyvllm.workers.flat_batch import FlatBatch, flatten, split_into_forwards
from tinyvllm.workers.sampling_masks import SamplingMasks
from tinyvllm.workers.host_swap import HostSwap
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.logprobs import logprobs_of, to_token_logprobs, top_count_bucket
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.sampling_batch import BatchSampler
from tinyvllm.workers.sharded_forward import ShardedForward
from tinyvllm.workers.spec_verify import DraftLogits, verify
from tinyvllm.workers.stage_link import StageLink

if TYPE_CHECKING:
    from tinyvllm.workers.captured_steps import CapturedSteps
    from tinyvllm.workers.draft_model import DraftModel


MIDPOINT_BUCKETS_FROM = 256  # token buckets from here on have one halfway to the next (384, 768, ...): each costs
                             # its captured step's memory (a 1B model's 192 and 384 together ~100 MB)


def buckets_up_to(limit: int, midpoints_from: int | None = None) -> list[int]:
    """1, 2, 4, ... below limit, then limit; from `midpoints_from` on also the sizes halfway between (384, 768, ...):
    a step is padded to its bucket and computes the padding, so a prompt chunk of 259 tokens took a 512-token step's
    time (1B Q4_K_M: ~2 s, where 384 takes ~1.5)."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        if midpoints_from is not None and size >= midpoints_from and size * 3 // 2 < limit:
            sizes.append(size * 3 // 2)
        size *= 2
    return sizes + [limit]


def capture_on_next_call(jit: TinyJit) -> None:
    """A TinyJit's first call runs eagerly so that one-time work (realizing weights) stays out of the capture; here
    every weight and cache buffer is already realized, so warm-up captures on the first call: half the start-up."""
    if jit.cnt == 0:
        jit.cnt = 1


def bucket_for(n: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= n)


@dataclass(slots=True)
class StepWork:
    rows: list[ScheduledChunk] = field(default_factory=list)  # the chunks that sample, in plan order
    logits: Tensor | None = None  # [>= len(rows), V]: row i is rows[i]'s
    pooled: list[tuple[ScheduledChunk, list[float]]] = field(default_factory=list)  # finished embedding requests
    draft_logits: list[Tensor] = field(default_factory=list)  # per forward with drafts (workers/spec_verify.py)
    failed: dict[str, str] = field(default_factory=dict)  # requests not computed: req_id -> why (an adapter)


class ModelRunner:
    def __init__(self, model: Transformer, cache: PagedKVCache, max_num_seqs: int, max_model_len: int,
                 max_num_batched_tokens: int, spec: ShardSpec = ShardSpec(), group=None, link: StageLink | None = None,
                 swap_space_bytes: int = 0, *, draft: "DraftModel | None" = None,
                 sampling_masks: SamplingMasks | None = None, captured_steps: "CapturedSteps | None" = None):
        """spec: this worker's place among the engine's workers; group (workers/collective.HostGroup): its
        tensor-parallel peers; link: its pipeline neighbours. One worker alone needs none of them.
        swap_space_bytes: host memory for swapped-out KV blocks (workers/host_swap.py).
        draft: --speculative-config's draft model (workers/draft_model.py). sampling_masks: structured output and
        thinking budgets, on the worker that samples. captured_steps: makes the forward and sampler jits, loading
        stored steps from the disk and storing new captures (workers/captured_steps.py); None: plain TinyJits."""
        self.model, self.cache = model, cache
        self.spec, self.group, self.link = spec, group, link
        self.draft, self.sampling_masks, self.captured_steps = draft, sampling_masks, captured_steps
        new_jit = captured_steps.jit if captured_steps is not None else lambda name, fxn: TinyJit(fxn)
        self.max_blocks_per_seq = -(-max_model_len // cache.block_size)
        self.max_model_len = max_model_len
        self.max_rows = min(max_num_seqs, max_num_batched_tokens)
        self.row_buckets = buckets_up_to(self.max_rows)
        self.token_buckets = sorted(set(buckets_up_to(max_num_batched_tokens, MIDPOINT_BUCKETS_FROM)) | set(self.row_buckets))
        self.nb_var = UOp.variable("nb", 1, self.max_blocks_per_seq)
        self.forward_jits = {t: new_jit(f"forward-{t}", self._forward) for t in self.token_buckets}
        self.inputs = HostInputs()
        self.sharded = ShardedForward(self) if group is not None else None  # a group of one runs it too (tests)
        self.prompt_logprobs_jits: dict[tuple[int, int], TinyJit] = {}  # (tokens, top-k bucket)
        self.score_jits: dict[tuple[int, int], TinyJit] = {}  # (tokens, scoring requests' bucket)
        self.sampler = BatchSampler(self.row_buckets, new_jit)
        self.copy_vars = (UOp.variable("copy_src", 0, cache.num_blocks), UOp.variable("copy_dst", 0, cache.num_blocks))
        self.copy_jit = TinyJit(self._copy_block)
        self.block_io = KVBlockIO(cache)  # one block of every layer to and from host bytes
        self.host_swap = HostSwap(self.block_io, swap_space_bytes)
        self.batch = BatchState()
        self.draft_logits = DraftLogits(model)  # speculative decoding (workers/spec_verify.py)
        self.lora_slots: dict[str, int] = {}  # the step's adapters' slots (workers/lora.py)

    def rows_for(self, tokens: int) -> int:
        """Table rows (and logits rows) of a forward over a bucket of `tokens`: each row has a token at least."""
        return min(tokens, self.max_rows)

    # ---- jitted bodies -----------------------------------------------------------------------
    def _forward(self, tokens_or_x: Tensor, positions: Tensor, token_rows: Tensor, tables: Tensor, n_valid: Tensor,
                 sample_index: Tensor, nb: UOp, *lora_rows: Tensor) -> tuple[Tensor, Tensor] | Tensor:
        """-> (the logits of the sampling rows [R, V], the final hidden states [T, dim]); a pipeline stage before
        the last takes the previous stage's residual stream instead of tokens and returns its own. lora_rows: with
        adapters, each row's slot (workers/lora.py)."""
        attend = PagedAttention(self.cache, tables, token_rows, positions, n_valid, nb, self.model.kernels,
                                self.model.attention_specs)
        x = self.model.embed(tokens_or_x) if self.spec.first_stage else tokens_or_x
        mask = self.model.lora.token_mask(lora_rows[0], token_rows) if lora_rows else None
        x = self.model.run_layers(x, positions.clip(0, self.max_model_len - 1), attend, mask)
        if not self.spec.last_stage:
            Tensor.realize(x, *self.cache.tensors)
            return x
        hidden = self.model.final_norm(x)
        logits = self.model.logits(hidden[sample_index])
        Tensor.realize(logits, hidden, *self.cache.tensors)  # one schedule: realizing them apart runs the layers twice
        return logits, hidden

    def _score_logits(self, hidden_or_logits: Tensor, rows: Tensor, token_ids: Tensor) -> Tensor:
        """The logits of token_ids [S, MAX_SCORE_TOKENS] at positions rows [S] (given the logits of every position
        when the vocabulary is sharded: the ranks gathered them)."""
        picked = hidden_or_logits[rows]
        logits = self.model.logits(picked) if self.sharded is None else picked
        return logits.cast(dtypes.float32).gather(1, token_ids).realize()

    def _prompt_logprobs(self, k: int, hidden_or_logits: Tensor, next_tokens: Tensor) -> tuple[Tensor, ...]:
        """Each position's logprob of next_tokens (the following prompt token) and the top k (given the logits of
        every position when the vocabulary is sharded: the ranks gathered them)."""
        logits = self.model.logits(hidden_or_logits) if self.sharded is None else hidden_or_logits
        outs = logprobs_of(logits, next_tokens, k)
        Tensor.realize(*outs)
        return outs

    def _copy_block(self, src: UOp, dst: UOp):
        bs = self.cache.block_size
        for layer in self.cache.tensors:  # values and, for int8/fp8, their scales
            layer[dst * bs:dst * bs + bs].assign(layer[src * bs:src * bs + bs].contiguous())
        Tensor.realize(*self.cache.tensors)

    def copy_blocks(self, pairs: list[list[int]]) -> None:
        """Copy-on-write: block dst gets block src's keys and values (and their scales) in every layer."""
        for src, dst in pairs:
            self.copy_jit(self.copy_vars[0].bind(src), self.copy_vars[1].bind(dst))
        if self.draft is not None:
            self.draft.copy_blocks(pairs)

    # ---- one step ------------------------------------------------------------------------------
    def prepare(self, pieces: list[ScheduledChunk]) -> FlatBatch:
        bucket = bucket_for(sum(p.length for p in pieces), self.token_buckets)
        return flatten(pieces, bucket, self.rows_for(bucket), self.max_blocks_per_seq, self.cache.block_size,
                       self.cache.scratch_block)

    def batch_inputs(self, batch: FlatBatch) -> tuple:
        """(positions, token_rows, tables, n_valid, sample_index, nb[, lora_rows]): a forward's inputs besides its
        tokens."""
        inputs = (self.inputs("positions", batch.positions), self.inputs("token_rows", batch.token_rows),
                  self.inputs("tables", batch.tables), self.inputs("n_valid", np.array([batch.num_tokens], np.int32)),
                  self.inputs("sample_index", batch.sample_index), self.nb_var.bind(batch.num_blocks))
        if (lora := self.model.lora) is None:
            return inputs
        rows = lora.row_slots([p.state.sampling.lora for p in batch.pieces], len(batch.tables), self.lora_slots)
        return (*inputs, self.inputs("lora_rows", rows))

    def run_forward(self, batch: FlatBatch) -> tuple[Tensor | None, Tensor | None]:
        """(the sampling rows' logits, the final hidden states), each None on a worker that does not have them
        (a stage before the last; the logits on a tensor-parallel rank that does not sample). The outputs live in
        the jits' buffers: valid until the same bucket runs again."""
        if self.sharded is not None:
            return self.sharded(batch)
        first = self.inputs("tokens" if self.spec.first_stage else "hidden", batch.tokens if self.spec.first_stage
                            else self.link.recv())
        capture_on_next_call(jit := self.forward_jits[batch.bucket])  # a bucket's first step captures (not eager, then again)
        out = jit(first, *self.batch_inputs(batch))
        if not self.spec.last_stage:
            self.link.send(host_array(out))
            return None, None
        return out

    def compute(self, plan: StepPlan) -> StepWork:
        """Runs the plan's tokens through the model: the logits of the chunks that sample, the finished embeddings.
        With one forward (the usual case) work.logits is the jit's own output buffer, valid until the next step."""
        chunks = self.batch.apply(plan)
        work = StepWork()
        if self.model.lora is not None:
            chunks = self._with_adapters(chunks, work.failed)
        self.host_swap.swap_out(plan.swap_out)  # reads blocks before the copies and swap-ins may reuse them
        self.copy_blocks(plan.block_copies)
        self.host_swap.swap_in(plan.swap_in)
        forwards = split_into_forwards(chunks, self.token_buckets[-1], self.max_rows)
        parts = []
        for pieces in forwards:
            batch = self.prepare(pieces)
            logits, hidden = self.run_forward(batch)
            if self.draft is not None:  # its KV holds every token the target computes
                self.draft.follow(batch)
            if hidden is not None and self.spec.samples and any(p.state.sampling.embed for p in pieces):
                work.pooled += self._pool(batch, hidden.numpy())
            if hidden is not None and any(p.scores for p in pieces):  # (every rank takes part in a sharded gather)
                work.pooled += self._scores(batch, hidden)
            if hidden is not None and any(p.needs_prompt_logprobs for p in pieces):
                self._record_prompt_logprobs(batch, hidden)
            work.rows += batch.sampled
            if logits is None:
                continue
            if (drafts := self.draft_logits(batch, hidden)) is not None:
                work.draft_logits.append(drafts)
            if len(forwards) == 1:
                work.logits = logits
            elif batch.sampled:  # a copy: the next forward may run in the same jit and reuse its buffers
                parts.append(logits[:len(batch.sampled)].clone().realize())
        if parts:
            work.logits = Tensor.cat(*parts).realize()
        return work

    def _with_adapters(self, chunks: list[ScheduledChunk], failed: dict[str, str]) -> list[ScheduledChunk]:
        """The chunks this step can run, their adapters in slots (self.lora_slots); a request whose adapter cannot
        be read goes to `failed` (req_id -> why) and is not computed: the scheduler ends it with that error."""
        lora = self.model.lora
        for chunk in chunks:
            if (adapter := chunk.state.sampling.lora) is not None and chunk.state.failed is None:
                try:
                    lora.read(adapter)
                except LoRAError as e:
                    chunk.state.failed = str(e)
            if chunk.state.failed is not None:
                failed[chunk.req_id] = chunk.state.failed
        chunks = [c for c in chunks if c.req_id not in failed]
        self.lora_slots = lora.activate([c.state.sampling.lora for c in chunks if c.state.sampling.lora is not None])
        return chunks

    def execute(self, plan: StepPlan, rank: int = 0) -> StepResult:
        work = self.compute(plan)
        result = StepResult(plan.step_id, rank, [], [])
        result.failed_req_ids, result.failed_reasons = list(work.failed), list(work.failed.values())
        if not self.spec.samples:
            return result  # the scheduler reads one rank's result: this one only says the step is done
        if work.rows:
            states = [c.state for c in work.rows]
            # the forward was dispatched in compute(): the masks are computed on the host while the device runs it
            allowed = None
            if self.sampling_masks is not None and any(s.sampling.masked for s in states):
                allowed = self.sampling_masks.allowed(states, work.logits.shape[1])
            tokens, logprobs = self.sampler.sample(states, work.logits, allowed)
            if work.draft_logits:  # never a constrained row's: the scheduler drafts no tokens for those
                result.accepted_draft_ids = verify(self.sampler, work.rows, tokens, work.draft_logits)
            if self.draft is not None:  # the next step's drafts, from each row's new tokens
                result.proposed_draft_ids = self.draft.propose(work.rows, tokens, result.accepted_draft_ids)
            prompt_logprobs = []
            for chunk, token in zip(work.rows, tokens):  # the next plan brings the token back, or says to append it
                chunk.state.last_sampled = token
                result.req_ids.append(chunk.req_id)
                result.sampled_token_ids.append(token)
                prompt_logprobs.append(chunk.state.prompt_logprobs if chunk.state.sampling.prompt_logprobs is not None
                                       else None)
                chunk.state.prompt_logprobs = []
            if any(lp is not None for lp in logprobs):
                result.logprobs = logprobs
            if any(plp for plp in prompt_logprobs):
                result.prompt_logprobs = [plp or None for plp in prompt_logprobs]
        for chunk, embedding in work.pooled:
            result.pooled_req_ids.append(chunk.req_id)
            result.embeddings.append(embedding)
        return result

    # ---- embeddings and prompt logprobs ----------------------------------------------------------
    def _pool(self, batch: FlatBatch, hidden: np.ndarray) -> list[tuple[ScheduledChunk, list[float]]]:
        """Adds each embedding piece's final hidden states to its request's sum; a request's last piece finishes
        it: the mean over the prompt's positions, L2-normalised."""
        finished = []
        for piece, offset in zip(batch.pieces, batch.offsets):
            if not piece.state.sampling.embed:
                continue
            state = piece.state
            part = hidden[offset:offset + piece.length].sum(0)
            state.pooled_sum = part if state.pooled_sum is None else state.pooled_sum + part
            if piece.samples:
                mean = state.pooled_sum.astype(np.float64) / len(state.token_ids)
                finished.append((piece, (mean / max(np.linalg.norm(mean), 1e-12)).tolist()))
        return finished

    def _scores(self, batch: FlatBatch, hidden: Tensor) -> list[tuple[ScheduledChunk, list[float]]]:
        """Each finished scoring request's result: its score_token_ids' logits at its prompt's last position."""
        if self.sharded is not None and (hidden := self.sharded.gather_all_logits(batch, hidden)) is None:
            return []  # a rank that does not sample took part in the gather
        scoring = [(p, o + p.length - 1) for p, o in zip(batch.pieces, batch.offsets) if p.scores]
        count = 1 << (len(scoring) - 1).bit_length()  # a power of two: few captured variants
        if (jit := self.score_jits.get((batch.bucket, count))) is None:
            jit = self.score_jits[(batch.bucket, count)] = TinyJit(self._score_logits)
        rows, token_ids = np.zeros(count, np.int32), np.zeros((count, MAX_SCORE_TOKENS), np.int32)
        for i, (piece, last) in enumerate(scoring):
            ids = piece.state.sampling.score_token_ids
            rows[i], token_ids[i, :len(ids)] = last, ids
        logits = host_array(jit(hidden, device_tensor(rows), device_tensor(token_ids)))
        return [(piece, logits[i, :len(piece.state.sampling.score_token_ids)].tolist())
                for i, (piece, _) in enumerate(scoring)]

    def _record_prompt_logprobs(self, batch: FlatBatch, hidden: Tensor) -> None:
        """The logprobs of the prompt tokens that the batch's positions predict, for the pieces that asked."""
        if self.sharded is not None and (hidden := self.sharded.gather_all_logits(batch, hidden)) is None:
            return  # a rank that does not sample took part in the gather
        asking = [(p, o) for p, o in zip(batch.pieces, batch.offsets) if p.needs_prompt_logprobs]
        bucket = top_count_bucket(max(p.state.sampling.prompt_logprobs for p, _ in asking))
        if (jit := self.prompt_logprobs_jits.get((batch.bucket, bucket))) is None:
            jit = self.prompt_logprobs_jits[(batch.bucket, bucket)] = TinyJit(
                lambda h, n: self._prompt_logprobs(bucket, h, n))
        next_tokens = np.zeros(batch.bucket, np.int32)
        for piece, offset in asking:
            following = piece.state.token_ids[piece.start + 1:piece.start + piece.length + 1]
            next_tokens[offset:offset + len(following)] = following
        outs = [host_array(o) for o in jit(hidden, device_tensor(next_tokens))]
        for piece, offset in asking:
            state, k = piece.state, piece.state.sampling.prompt_logprobs
            n = min(piece.length, state.num_prompt_tokens - 1 - piece.start)  # positions whose next token is a prompt token
            rows = slice(offset, offset + n)
            state.prompt_logprobs += to_token_logprobs(
                state.token_ids[piece.start + 1:piece.start + 1 + n], outs[0][rows].tolist(),
                outs[1][rows].tolist() if bucket else None, outs[2][rows].tolist() if bucket else None, k)

    # ---- start-up ------------------------------------------------------------------------------
    def warm_up(self, progress=None) -> int:
        """Captures every token bucket's forward (and the plain greedy and sampling variants of the sampler for
        each row bucket) before the first request, so no request waits for a compile. Every write goes to the
        scratch block. progress(done, total, what) is called after each bucket. Returns the number of buckets."""
        for done, size in enumerate(self.token_buckets, 1):
            self.warm_up_bucket(size)
            if progress is not None:
                progress(done, len(self.token_buckets), f"tokens {size}")
        self.finish_warm_up()
        return len(self.token_buckets)

    def finish_warm_up(self) -> None:
        """Once every bucket is captured: builds the tokenizer structured output needs (about a second), so no
        constrained request waits for it, and ends tinygrad's compile processes (~25 MB each, idle from now on; a
        later compile starts them again)."""
        if self.sampling_masks is not None:
            self.sampling_masks.tokenizer
        terminate_worker_pool()

    def warm_up_bucket(self, size: int) -> bool:
        """Captures token bucket `size` as warm_up does, or runs once a step loaded from the disk; False (and nothing
        done) if a served step already has."""
        if (jit := self.forward_jits[size]).captured is not None and getattr(jit, "primed", True):
            return False
        capture_on_next_call(jit)
        padding = flatten([], size, self.rows_for(size), self.max_blocks_per_seq, self.cache.block_size,
                          self.cache.scratch_block)
        logits, _ = self.run_forward(padding)
        if size in self.row_buckets and logits is not None:
            for greedy in (True, False):
                self.sampler.warm_up(size, self.model.cfg.vocab_size, greedy, logits)
        if self.draft is not None:
            self.draft.warm_up_bucket(size)
        return True
