"""Runs one StepPlan on the model: decode rows batched into a jitted step per batch-size bucket,
prefill chunks through a jitted step per chunk-size bucket, then sampling on the device.

Two prefill variants serve the requests that need every position, compiled only when first asked for:
prompt logprobs (the [T, V] logits reduced on the device to each position's logprob of the next prompt token
and its top-k) and embeddings (the final hidden states summed over the chunk's valid positions)."""
import functools
import time
from dataclasses import dataclass, field

import numpy as np
from tinygrad import Tensor, TinyJit, UOp, dtypes

from tinyvllm.protocol.messages import StepPlan, StepResult
from tinyvllm.workers.attention import DecodeAttention, PrefillAttention
from tinyvllm.workers.batch_state import BatchState, ScheduledChunk
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.logprobs import logprobs_of, to_token_logprobs, top_count_bucket
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.sampling_batch import BatchSampler


def buckets_up_to(limit: int, first: int) -> list[int]:
    sizes, size = [], first
    while size < limit:
        sizes.append(size)
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
    rows: list[tuple[ScheduledChunk, Tensor]] = field(default_factory=list)  # chunks that sample, [1, V] logits
    pooled: list[tuple[ScheduledChunk, list[float]]] = field(default_factory=list)  # finished embedding requests
    batch_logits: Tensor | None = None  # all of `rows` at once ([>= len(rows), V]) when they are one decode batch


class ModelRunner:
    def __init__(self, model: Transformer, cache: PagedKVCache, max_num_seqs: int, max_model_len: int,
                 max_num_batched_tokens: int):
        self.model, self.cache = model, cache
        bs = cache.block_size
        self.max_blocks_per_seq = -(-max_model_len // bs)
        self.max_model_len = max_model_len
        self.decode_buckets = buckets_up_to(max_num_seqs, 1)
        prefill_limit = -(-min(max_num_batched_tokens, max_model_len) // bs) * bs
        self.prefill_buckets = buckets_up_to(prefill_limit, bs)
        self.nb_var = UOp.variable("nb", 1, self.max_blocks_per_seq)
        self.decode_jits = {b: TinyJit(self._decode_step) for b in self.decode_buckets}
        self.prefill_jits = {t: TinyJit(self._prefill_step) for t in self.prefill_buckets}
        self.prefill_logprobs_jits: dict[tuple[int, int], TinyJit] = {}  # (T, top-k bucket)
        self.prefill_pool_jits: dict[int, TinyJit] = {}
        self.sampler = BatchSampler(self.decode_buckets)
        self.copy_vars = (UOp.variable("copy_src", 0, cache.num_blocks), UOp.variable("copy_dst", 0, cache.num_blocks))
        self.copy_jit = TinyJit(self._copy_block)
        self.batch = BatchState()

    # ---- jitted bodies -----------------------------------------------------------------------
    def _decode_step(self, tokens: Tensor, positions: Tensor, block_tables: Tensor, context_lens: Tensor, nb: UOp):
        attend = DecodeAttention(self.cache, block_tables, nb, context_lens, self.model.cpu_kernels)
        logits = self.model.logits(self.model.forward(tokens, positions, attend))
        Tensor.realize(logits, *self.cache.layers)  # one schedule: realizing them apart runs the layers twice
        return logits

    def _prefill_hidden(self, tokens: Tensor, start: Tensor, n_valid: Tensor, block_table: Tensor, nb: UOp) -> Tensor:
        T = tokens.shape[0]
        positions = (start + Tensor.arange(T, dtype=dtypes.int32)).clip(0, self.max_model_len - 1)
        attend = PrefillAttention(self.cache, block_table, nb, start, n_valid, T, self.model.cpu_kernels)
        hidden = self.model.forward(tokens, positions, attend)
        Tensor.realize(hidden, *self.cache.layers)  # together: realizing the cache alone would leave hidden to recompute
        return hidden

    def _prefill_step(self, tokens: Tensor, start: Tensor, n_valid: Tensor, block_table: Tensor, nb: UOp):
        hidden = self._prefill_hidden(tokens, start, n_valid, block_table, nb)
        return self.model.logits(hidden[(n_valid - 1).clip(0, tokens.shape[0] - 1)]).realize()

    def _prefill_logprobs_step(self, k: int, tokens: Tensor, start: Tensor, n_valid: Tensor, block_table: Tensor,
                               next_tokens: Tensor, nb: UOp):
        """The last position's logits, and each position's logprob of next_tokens (the following prompt token)."""
        logits = self.model.logits(self._prefill_hidden(tokens, start, n_valid, block_table, nb))
        outs = (logits[(n_valid - 1).clip(0, tokens.shape[0] - 1)], *logprobs_of(logits, next_tokens, k))
        Tensor.realize(*outs)
        return outs

    def _prefill_pool_step(self, tokens: Tensor, start: Tensor, n_valid: Tensor, block_table: Tensor, nb: UOp):
        """The final hidden states (after the final norm) summed over the chunk's valid positions: [dim]."""
        hidden = self._prefill_hidden(tokens, start, n_valid, block_table, nb)
        valid = Tensor.arange(tokens.shape[0], dtype=dtypes.int32).reshape(-1, 1) < n_valid.reshape(1, 1)
        return valid.where(hidden, 0.0).sum(0).realize()

    def _copy_block(self, src: UOp, dst: UOp):
        bs = self.cache.block_size
        for layer in self.cache.layers:
            layer[dst * bs:dst * bs + bs].assign(layer[src * bs:src * bs + bs].contiguous())
        Tensor.realize(*self.cache.layers)

    def copy_blocks(self, pairs: list[list[int]]) -> None:
        """Copy-on-write: block dst gets block src's keys and values in every layer."""
        for src, dst in pairs:
            self.copy_jit(self.copy_vars[0].bind(src), self.copy_vars[1].bind(dst))

    # ---- one step ------------------------------------------------------------------------------
    def compute(self, plan: StepPlan, keep_logits: bool = True) -> StepWork:
        """Runs the plan's tokens through the model. Returns the [1, V] logits of each chunk that ends at the end
        of its request's known tokens (the ones to sample from), in plan order, and the finished embeddings.
        keep_logits=False (execute, which samples at once): a single decode batch's logits stay in the jit's
        output buffer (valid until its next call) and come back whole as batch_logits too, saving two copies."""
        chunks = self.batch.apply(plan)
        self.copy_blocks(plan.block_copies)
        decodes = [c for c in chunks if c.length == 1 and not c.needs_full_prefill]
        max_batch = max(self.decode_buckets)
        work = StepWork()
        alias = not keep_logits and len(decodes) <= max_batch  # a jit reuses its output buffer on the next call
        for i in range(0, len(decodes), max_batch):
            group = decodes[i:i + max_batch]
            decode_logits = self._run_decode(group) if alias else self._run_decode(group).clone().realize()
            work.rows += [(c, decode_logits[j:j + 1]) for j, c in enumerate(group) if c.samples]
        one_batch = alias and decodes and len(work.rows) == len(decodes)  # every decode row samples, in order
        for chunk in (c for c in chunks if c.length > 1 or c.needs_full_prefill):
            logits = self._run_chunk(chunk)
            if chunk.samples and chunk.pools:
                work.pooled.append((chunk, self._finish_embedding(chunk)))
            elif chunk.samples:
                work.rows.append((chunk, logits.clone().realize()))
        if one_batch and len(work.rows) == len(decodes):  # and no prefill chunk samples
            work.batch_logits = decode_logits
        return work

    def compute_logits(self, plan: StepPlan) -> list[tuple[ScheduledChunk, Tensor]]:
        return self.compute(plan).rows

    def execute(self, plan: StepPlan, rank: int = 0) -> StepResult:
        t0 = time.perf_counter()
        work = self.compute(plan, keep_logits=False)
        result = StepResult(plan.step_id, rank, [], [])
        if work.rows:
            states = [c.state for c, _ in work.rows]
            logits = work.batch_logits if work.batch_logits is not None else Tensor.cat(*[lg for _, lg in work.rows])
            tokens, logprobs = self.sampler.sample(states, logits)
            prompt_logprobs = []
            for (chunk, _), token in zip(work.rows, tokens):
                chunk.state.append_token(token)
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
        result.elapsed_s = time.perf_counter() - t0
        return result

    def _block_table_row(self, block_ids: list[int], out: np.ndarray) -> None:
        out[:] = self.cache.scratch_block
        out[:len(block_ids)] = block_ids

    def _run_decode(self, group: list[ScheduledChunk]) -> Tensor:
        B = bucket_for(len(group), self.decode_buckets)
        tokens, positions, context_lens = np.zeros(B, np.int32), np.zeros(B, np.int32), np.ones(B, np.int32)
        tables = np.full((B, self.max_blocks_per_seq), self.cache.scratch_block, np.int32)
        for j, c in enumerate(group):
            tokens[j], positions[j], context_lens[j] = c.state.token_ids[c.start], c.start, c.start + 1
            self._block_table_row(c.state.block_ids, tables[j])
        return self._call_decode(tokens, positions, tables, context_lens)

    def _call_decode(self, tokens: np.ndarray, positions: np.ndarray, tables: np.ndarray, context_lens: np.ndarray) -> Tensor:
        """Padding rows (context length 1, a table row of scratch blocks) write to the scratch block."""
        bs = self.cache.block_size
        nb = max(int(context_lens.max()) + bs - 1, bs) // bs
        return self.decode_jits[len(tokens)](device_tensor(tokens), device_tensor(positions), device_tensor(tables),
                                             device_tensor(context_lens), self.nb_var.bind(nb))

    # ---- start-up ------------------------------------------------------------------------------
    def warm_up(self, progress=None) -> int:
        """Captures every decode and prefill bucket's TinyJit (and the plain greedy and sampling variants of the
        sampler) before the first request, so no request waits for a compile. Every write goes to the scratch
        block. progress(done, total, what) is called after each bucket. Returns the number of buckets captured."""
        todo = [("decode", b) for b in self.decode_buckets] + [("prefill", t) for t in self.prefill_buckets]
        scratch, vocab = self.cache.scratch_block, self.model.cfg.vocab_size
        for done, (kind, size) in enumerate(todo, 1):
            if kind == "decode":
                capture_on_next_call(self.decode_jits[size])
                logits = self._call_decode(np.zeros(size, np.int32), np.zeros(size, np.int32),
                                           np.full((size, self.max_blocks_per_seq), scratch, np.int32),
                                           np.ones(size, np.int32))
                for greedy in (True, False):
                    self.sampler.warm_up(size, vocab, greedy, logits)
            else:
                capture_on_next_call(self.prefill_jits[size])
                table = np.full(self.max_blocks_per_seq, scratch, np.int32)
                self.prefill_jits[size](device_tensor(np.zeros(size, np.int32)), device_tensor(np.zeros(1, np.int32)),
                                        device_tensor(np.ones(1, np.int32)), device_tensor(table), self.nb_var.bind(1)).realize()
            if progress is not None:
                progress(done, len(todo), f"{kind} {size}")
        return len(todo)

    def _run_chunk(self, chunk: ScheduledChunk) -> Tensor | None:
        """Runs a chunk through prefill steps of at most the largest bucket; returns the last piece's logits."""
        max_chunk, logits = max(self.prefill_buckets), None
        for piece_start in range(chunk.start, chunk.start + chunk.length, max_chunk):
            length = min(max_chunk, chunk.start + chunk.length - piece_start)
            if chunk.pools:
                pooled = self._run_prefill(self._prefill_pool_jit, chunk, piece_start, length).numpy()
                state = chunk.state
                state.pooled_sum = pooled if state.pooled_sum is None else state.pooled_sum + pooled
            elif chunk.needs_prompt_logprobs:
                logits = self._run_prompt_logprobs(chunk, piece_start, length)
            else:
                logits = self._run_prefill(lambda T: self.prefill_jits[T], chunk, piece_start, length)
        return logits

    def _finish_embedding(self, chunk: ScheduledChunk) -> list[float]:
        """Mean over the prompt's positions, then L2-normalised."""
        mean = chunk.state.pooled_sum.astype(np.float64) / len(chunk.state.token_ids)
        return (mean / max(np.linalg.norm(mean), 1e-12)).tolist()

    def _prefill_pool_jit(self, T: int) -> TinyJit:
        if T not in self.prefill_pool_jits:
            self.prefill_pool_jits[T] = TinyJit(self._prefill_pool_step)
        return self.prefill_pool_jits[T]

    def _run_prompt_logprobs(self, chunk: ScheduledChunk, start: int, length: int) -> Tensor:
        """A prefill piece that also records the logprobs of the prompt tokens its positions predict."""
        state, k = chunk.state, chunk.state.sampling.prompt_logprobs
        bucket = top_count_bucket(k)
        T = bucket_for(length, self.prefill_buckets)
        if (T, bucket) not in self.prefill_logprobs_jits:
            self.prefill_logprobs_jits[(T, bucket)] = TinyJit(functools.partial(self._prefill_logprobs_step, bucket))
        next_tokens = np.zeros(T, np.int32)
        following = state.token_ids[start + 1:start + length + 1]
        next_tokens[:len(following)] = following
        outs = self._run_prefill(lambda _: self.prefill_logprobs_jits[(T, bucket)], chunk, start, length,
                                 extra=(device_tensor(next_tokens),))
        last_logits, chosen = outs[0].clone().realize(), outs[1].numpy()
        top_ids, top_lp = (outs[2].numpy().tolist(), outs[3].numpy().tolist()) if bucket else (None, None)
        n = min(length, state.num_prompt_tokens - 1 - start)  # positions whose next token is a prompt token
        if n > 0:
            state.prompt_logprobs += to_token_logprobs(following[:n], chosen[:n].tolist(), top_ids, top_lp, k)
        return last_logits

    def _run_prefill(self, jit_for, chunk: ScheduledChunk, start: int, length: int, extra: tuple = ()):
        """Calls jit_for(T) (a jitted prefill step for bucket T) on positions [start, start + length); `extra`
        tensors go after the block table."""
        T, bs = bucket_for(length, self.prefill_buckets), self.cache.block_size
        tokens = np.zeros(T, np.int32)
        tokens[:length] = chunk.state.token_ids[start:start + length]
        table = np.empty(self.max_blocks_per_seq, np.int32)
        self._block_table_row(chunk.state.block_ids, table)
        return jit_for(T)(device_tensor(tokens), device_tensor(np.array([start], np.int32)),
                          device_tensor(np.array([length], np.int32)), device_tensor(table), *extra,
                          self.nb_var.bind((start + length - 1) // bs + 1))
