"""A step's scheduled chunks as flat token batches: the host-side inputs of one jitted forward each.

A forward takes up to `max_tokens` tokens of up to `max_rows` sequences: decodes (one token) and prompt chunks (many)
of different requests alike, laid end to end. Each token carries its position and the row of `tables` (one block
table row per sequence) it belongs to; the batch is padded to its bucket with tokens that write to the scratch
block. A plan larger than one forward (more tokens than the largest bucket) is cut into several, a chunk split
across two of them where it must: the later piece sees the earlier piece's keys, which the earlier forward wrote.
"""
from dataclasses import dataclass

import numpy as np

from tinyvllm.workers.batch_state import ScheduledChunk


@dataclass(slots=True)
class FlatBatch:
    pieces: list[ScheduledChunk]  # in batch order; piece i's tokens start at offsets[i] and use table row i
    offsets: list[int]
    num_tokens: int  # real tokens; the rest of the bucket is padding
    tokens: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    token_rows: np.ndarray  # [T] int32
    tables: np.ndarray  # [R, max_blocks] int32
    sample_index: np.ndarray  # [R] int32: the batch index of each sampling piece's last token, then 0s
    sampled: list[ScheduledChunk]  # the pieces that sample, in sample_index order
    num_blocks: int  # how many blocks of its table the furthest token reaches

    @property
    def bucket(self) -> int:
        return len(self.tokens)


def split_into_forwards(chunks: list[ScheduledChunk], max_tokens: int, max_rows: int) -> list[list[ScheduledChunk]]:
    """Cuts a step's chunks, in order, into forwards of at most max_tokens tokens and max_rows pieces."""
    forwards: list[list[ScheduledChunk]] = []
    current: list[ScheduledChunk] = []
    used = 0
    for chunk in chunks:
        start, left = chunk.start, chunk.length
        while left > 0:
            if len(current) == max_rows or used == max_tokens:
                forwards.append(current)
                current, used = [], 0
            take = min(left, max_tokens - used)
            current.append(ScheduledChunk(chunk.req_id, chunk.state, start, take))
            start, left, used = start + take, left - take, used + take
    return forwards + [current] if current else forwards


def flatten(pieces: list[ScheduledChunk], bucket: int, rows: int, max_blocks: int, block_size: int,
            scratch_block: int) -> FlatBatch:
    """The inputs of one forward over `pieces`, padded to `bucket` tokens and `rows` table rows."""
    tokens, positions, token_rows = (np.zeros(bucket, np.int32) for _ in range(3))
    tables = np.full((rows, max_blocks), scratch_block, np.int32)
    sample_index = np.zeros(rows, np.int32)
    offsets, sampled, offset, furthest = [], [], 0, 0
    for row, piece in enumerate(pieces):
        end = offset + piece.length
        tokens[offset:end] = piece.state.token_ids[piece.start:piece.start + piece.length]
        positions[offset:end] = np.arange(piece.start, piece.start + piece.length)
        token_rows[offset:end] = row
        block_ids = piece.state.block_ids
        if len(block_ids) > max_blocks:
            raise ValueError(f"{piece.req_id}: {len(block_ids)} blocks, more than a sequence can hold ({max_blocks})")
        tables[row, :len(block_ids)] = block_ids
        if piece.samples and not piece.pools:
            sample_index[len(sampled)] = end - 1
            sampled.append(piece)
        offsets.append(offset)
        offset, furthest = end, max(furthest, piece.start + piece.length)
    return FlatBatch(pieces, offsets, offset, tokens, positions, token_rows, tables, sample_index, sampled,
                     max(-(-furthest // block_size), 1))
