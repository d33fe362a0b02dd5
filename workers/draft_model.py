"""Draft-model speculative decoding, the worker's half of proposing (scheduler/spec_decode.py plans the drafts,
workers/spec_verify.py verifies them).

The draft model (a smaller model with the target's tokenizer) lives in the worker beside the target, in a ModelRunner
of its own: its own jitted forwards (one TinyJit per token bucket, as the target's) and its own paged KV cache, with
as many blocks of the same size as the target's, addressed by the very block tables the scheduler gives the target,
so it needs no block manager. It runs every forward the target runs, on the same flat batch (prompt chunks and
verify chunks alike), so its cache holds every token the target computed, at the same slots; block copies
(copy-on-write) are mirrored.

After the step's sampling and verification, each row that may speculate (no grammar, penalties, logprobs: as the
scheduler decides) gets up to k proposals: one greedy decode forward over those rows per draft position, from the
row's newest token (its accepted drafts are in the draft's cache already: the step computed them). Those forwards
write KV at the positions after the row's tokens, in the lookahead slots the scheduler holds for it (never past its
block table or max_model_len); the next step's forward overwrites them with the tokens it computes, as it does the
target's rejected drafts.

Greedy drafts make the proposal a point mass: a deterministic function of the request's tokens, independent of the
target's sampling noise at the positions it drafts. So verification stays exact (workers/spec_verify.py): greedy
output is the target's own, token for token, and sampled output has exactly the target's distribution (a seeded
request samples the very tokens it would without speculation); the draft only decides how many tokens a step gains.

KV the target's cache gets without a forward (host swap-ins, disaggregated pulls, persistent prefix cache loads) is
not mirrored: the draft's cache keeps what those blocks held before, which can only lower acceptance.
"""
import numpy as np
from tinygrad import Tensor, TinyJit

from tinyvllm.protocol.speculative_config import SpeculativeConfig, check_draft_vocab, may_draft
from tinyvllm.workers.batch_state import ScheduledChunk
from tinyvllm.workers.device_input import host_array
from tinyvllm.workers.flat_batch import FlatBatch, flatten


def load_draft(config: SpeculativeConfig | None, target_vocab_size: int):
    """(config, weights, k) of --speculative-config's draft model, or None without one. ValueError if its vocabulary
    is not the target's (the draft must share the target's tokenizer)."""
    if config is None or config.method != "draft_model":
        return None
    from tinyvllm.workers.weights import load_weights
    cfg, weights = load_weights(config.model)
    check_draft_vocab(cfg.vocab_size, target_vocab_size, config.model)
    return cfg, weights, config.num_speculative_tokens


class DraftModel:
    def __init__(self, runner, num_speculative_tokens: int):
        """runner: a workers.model_runner.ModelRunner of the draft model, with the target's limits and a cache of as
        many blocks of the same size as the target's."""
        self.runner, self.k = runner, num_speculative_tokens
        self.argmax_jits: dict[int, TinyJit] = {}  # by token bucket: the argmax of its forward's logits rows

    def follow(self, batch: FlatBatch) -> None:
        """Runs the draft over a forward of the target (its KV at the same slots; the logits are not needed)."""
        self.runner.run_forward(batch)

    def copy_blocks(self, pairs: list[list[int]]) -> None:
        self.runner.copy_blocks(pairs)

    @staticmethod
    def _argmax(logits: Tensor) -> Tensor:
        return logits.argmax(-1).cast("int32").realize()

    def greedy(self, batch: FlatBatch, n: int) -> np.ndarray:
        """The draft's argmax token after each of the batch's first n sampling rows."""
        logits, _ = self.runner.run_forward(batch)
        if (jit := self.argmax_jits.get(batch.bucket)) is None:
            jit = self.argmax_jits[batch.bucket] = TinyJit(self._argmax)
        return host_array(jit(logits))[:n]

    def decode_batch(self, rows: list[tuple[list[int], int, int]]) -> FlatBatch:
        """One forward of one token per row: (block table, position, token) each; each row samples."""
        r = self.runner
        n = len(rows)
        bucket = next(b for b in r.token_buckets if b >= n)
        tokens, positions, token_rows = (np.zeros(bucket, np.int32) for _ in range(3))
        tables = np.full((r.rows_for(bucket), r.max_blocks_per_seq), r.cache.scratch_block, np.int32)
        sample_index = np.zeros(r.rows_for(bucket), np.int32)
        for row, (block_ids, position, token) in enumerate(rows):
            tokens[row], positions[row], token_rows[row], sample_index[row] = token, position, row, row
            tables[row, :len(block_ids)] = block_ids
        num_blocks = max(-(-(max(p for _, p, _ in rows) + 1) // r.cache.block_size), 1)
        return FlatBatch([], [], n, tokens, positions, token_rows, tables, sample_index, [], num_blocks)

    def propose(self, rows: list[ScheduledChunk], tokens: list[int], accepted: list[list[int]]) -> list[list[int]]:
        """Per sampled row (empty if none proposes): the draft's greedy tokens to follow the row's new tokens (its
        accepted drafts, then tokens[row]); up to k, as many as its block table's slots and max_model_len allow;
        none for a row that may not speculate."""
        block_size, limit = self.runner.cache.block_size, self.runner.max_model_len
        live = []  # [row, block table, position of its newest token, forwards it gets]
        for i, chunk in enumerate(rows):
            state = chunk.state
            if chunk.pools or not may_draft(state.sampling):
                continue
            position = len(state.token_ids) + (len(accepted[i]) if accepted else 0)  # the drafts left token_ids
            n = min(self.k, len(state.block_ids) * block_size - position, limit - position)
            if n > 0:
                live.append([i, state.block_ids, position, n])
        proposals: list[list[int]] = [[] for _ in rows]
        newest = {i: tokens[i] for i, *_ in live}
        for j in range(self.k):
            active = [entry for entry in live if entry[3] > j]
            if not active:
                break
            batch = self.decode_batch([(table, position + j, newest[i]) for i, table, position, _ in active])
            for (i, *_), token in zip(active, self.greedy(batch, len(active)).tolist()):
                proposals[i].append(token)
                newest[i] = token
        return proposals if any(proposals) else []

    def warm_up_bucket(self, size: int) -> None:
        """Captures the draft's forward of token bucket `size`, and the argmax after a row bucket's (unless a served
        step already has)."""
        from tinyvllm.workers.model_runner import capture_on_next_call
        r = self.runner
        if r.forward_jits[size].captured is not None:
            return
        capture_on_next_call(r.forward_jits[size])
        padding = flatten([], size, r.rows_for(size), r.max_blocks_per_seq, r.cache.block_size, r.cache.scratch_block)
        for _ in range(2 if size in r.row_buckets else 1):  # a TinyJit captures on its second call
            self.greedy(padding, 0) if size in r.row_buckets else r.run_forward(padding)


def make_draft_model(cfg, weights, k: int, num_blocks: int, init, kernels: str, max_model_len: int):
    """The worker's DraftModel: the draft's weights and a cache of num_blocks blocks (InitWorker init's sizes)."""
    from tinyvllm.workers.kv_cache import PagedKVCache, cache_dtype
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.model_runner import ModelRunner
    model = Transformer(cfg, weights, max_model_len, kernels=kernels, dtype=init.engine.model.dtype)
    kv, batch = init.engine.cache, init.engine.batch
    cache = PagedKVCache(cfg, num_blocks, kv.block_size, cache_dtype(kv.kv_cache_dtype, kernels))
    runner = ModelRunner(model, cache, batch.max_num_seqs, max_model_len, batch.max_num_batched_tokens)
    return DraftModel(runner, k)
