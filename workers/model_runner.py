"""Runs one StepPlan on the model: decode rows batched into a jitted step per batch-size bucket,
prefill chunks through a jitted step per chunk-size bucket, then sampling on the device."""
import time

import numpy as np
from tinygrad import Tensor, TinyJit, UOp, dtypes

from protocol.messages import StepPlan, StepResult
from workers.attention import DecodeAttention, PrefillAttention
from workers.batch_state import BatchState, ScheduledChunk
from workers.kv_cache import PagedKVCache
from workers.model import Transformer
from workers.sampler import sample, sample_greedy


def buckets_up_to(limit: int, first: int) -> list[int]:
    sizes, size = [], first
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


def bucket_for(n: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= n)


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
        self.slot_vars = [UOp.variable(f"slot{i}", 0, cache.num_slots - 1) for i in range(max(self.decode_buckets))]
        self.block_vars = [UOp.variable(f"wblk{j}", 0, cache.num_blocks) for j in range(max(self.prefill_buckets) // bs + 1)]
        self.decode_jits = {b: TinyJit(self._decode_step) for b in self.decode_buckets}
        self.prefill_jits = {t: TinyJit(self._prefill_step) for t in self.prefill_buckets}
        self.sample_jits: dict[tuple[int, bool], TinyJit] = {}
        self.copy_vars = (UOp.variable("copy_src", 0, cache.num_blocks), UOp.variable("copy_dst", 0, cache.num_blocks))
        self.copy_jit = TinyJit(self._copy_block)
        self.batch = BatchState()

    # ---- jitted bodies -----------------------------------------------------------------------
    def _decode_step(self, tokens: Tensor, positions: Tensor, block_tables: Tensor, context_lens: Tensor, nb: UOp, *slots: UOp):
        attend = DecodeAttention(self.cache, block_tables[:, :nb], context_lens, list(slots))
        hidden = self.model.forward(tokens, positions, attend)
        Tensor.realize(*self.cache.layers)
        return self.model.logits(hidden).realize()

    def _prefill_step(self, tokens: Tensor, start: Tensor, n_valid: Tensor, block_table: Tensor, nb: UOp, *write_blocks: UOp):
        T = tokens.shape[0]
        positions = (start + Tensor.arange(T, dtype=dtypes.int32)).clip(0, self.max_model_len - 1)
        attend = PrefillAttention(self.cache, block_table[:nb], start, n_valid, list(write_blocks))
        hidden = self.model.forward(tokens, positions, attend)
        Tensor.realize(*self.cache.layers)
        return self.model.logits(hidden[(n_valid - 1).clip(0, T - 1)]).realize()

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
    def compute_logits(self, plan: StepPlan) -> list[tuple[ScheduledChunk, Tensor]]:
        """Runs the plan's tokens through the model; returns the [1, V] logits of each chunk that ends
        at the end of its request's known tokens (the ones to sample from), in plan order."""
        chunks = self.batch.apply(plan)
        self.copy_blocks(plan.block_copies)
        decodes = [c for c in chunks if c.length == 1]
        max_batch, max_chunk = max(self.decode_buckets), max(self.prefill_buckets)
        rows: list[tuple[ScheduledChunk, Tensor]] = []
        for i in range(0, len(decodes), max_batch):
            group = decodes[i:i + max_batch]
            logits = self._run_decode(group).clone().realize()  # a jit reuses its output buffer on the next call
            rows += [(c, logits[j:j + 1]) for j, c in enumerate(group) if c.samples]
        for chunk in (c for c in chunks if c.length > 1):
            for piece_start in range(chunk.start, chunk.start + chunk.length, max_chunk):
                logits = self._run_prefill(chunk, piece_start, min(max_chunk, chunk.start + chunk.length - piece_start))
            if chunk.samples:
                rows.append((chunk, logits.clone().realize()))
        return rows

    def execute(self, plan: StepPlan, rank: int = 0) -> StepResult:
        t0 = time.perf_counter()
        rows = self.compute_logits(plan)
        req_ids, tokens = [], []
        if rows:
            sampled = self._sample([c for c, _ in rows], Tensor.cat(*[logits for _, logits in rows]))
            for (chunk, _), token in zip(rows, sampled):
                chunk.state.token_ids.append(token)
                req_ids.append(chunk.req_id)
                tokens.append(token)
        return StepResult(plan.step_id, rank, req_ids, tokens, time.perf_counter() - t0)

    def _block_table_row(self, block_ids: list[int], out: np.ndarray) -> None:
        out[:] = self.cache.scratch_block
        out[:len(block_ids)] = block_ids

    def _run_decode(self, group: list[ScheduledChunk]) -> Tensor:
        B, bs = bucket_for(len(group), self.decode_buckets), self.cache.block_size
        tokens, positions, context_lens = np.zeros(B, np.int32), np.zeros(B, np.int32), np.ones(B, np.int32)
        tables = np.full((B, self.max_blocks_per_seq), self.cache.scratch_block, np.int32)
        slots = [self.cache.scratch_slot] * B
        for j, c in enumerate(group):
            tokens[j], positions[j], context_lens[j] = c.state.token_ids[c.start], c.start, c.start + 1
            self._block_table_row(c.state.block_ids, tables[j])
            slots[j] = c.state.block_ids[c.start // bs] * bs + c.start % bs
        nb = max(int(context_lens.max()) + bs - 1, bs) // bs
        binds = [v.bind(s) for v, s in zip(self.slot_vars, slots)]
        return self.decode_jits[B](Tensor(tokens), Tensor(positions), Tensor(tables), Tensor(context_lens),
                                   self.nb_var.bind(nb), *binds)

    def _run_prefill(self, chunk: ScheduledChunk, start: int, length: int) -> Tensor:
        T, bs = bucket_for(length, self.prefill_buckets), self.cache.block_size
        tokens = np.zeros(T, np.int32)
        tokens[:length] = chunk.state.token_ids[start:start + length]
        table = np.empty(self.max_blocks_per_seq, np.int32)
        self._block_table_row(chunk.state.block_ids, table)
        first, last = start // bs, (start + length - 1) // bs
        write_blocks = [int(table[b]) for b in range(first, last + 1)]
        write_blocks += [self.cache.scratch_block] * (T // bs + 1 - len(write_blocks))
        binds = [v.bind(b) for v, b in zip(self.block_vars, write_blocks)]
        return self.prefill_jits[T](Tensor(tokens), Tensor(np.array([start], np.int32)), Tensor(np.array([length], np.int32)),
                                    Tensor(table), self.nb_var.bind(last + 1), *binds)

    def _sample(self, chunks: list[ScheduledChunk], logits: Tensor) -> list[int]:
        R = len(chunks)
        greedy = all(c.state.sampling.greedy for c in chunks)
        R_pad = bucket_for(R, self.decode_buckets) if R <= max(self.decode_buckets) else R
        logits = logits.pad(((0, R_pad - R), None)) if R_pad > R else logits
        if (fn := self.sample_jits.get((R_pad, greedy))) is None:
            body = sample_greedy if greedy else sample
            fn = self.sample_jits[(R_pad, greedy)] = TinyJit(lambda *a: body(*a).realize())
        if greedy:
            return fn(logits.contiguous().realize()).numpy()[:R].tolist()
        params = np.zeros((4, R_pad), np.float32)
        seeds, positions = np.zeros(R_pad, np.uint32), np.zeros(R_pad, np.int32)
        for j, c in enumerate(chunks):
            sp = c.state.sampling
            params[:, j] = (sp.temperature, sp.top_k, sp.top_p, 0)
            seeds[j], positions[j] = c.state.seed, len(c.state.token_ids)
        out = fn(logits.contiguous().realize(), Tensor(params[0]), Tensor(params[1].astype(np.int32)), Tensor(params[2]),
                 Tensor(seeds), Tensor(positions))
        return out.numpy()[:R].tolist()
