"""Speculative decoding, the worker's half: verifying a request's drafts (scheduler/spec_decode.py).

A request with k drafts is one chunk of 1 + k positions: its last known token, then the drafts (appended to its
tokens for this step only). The logits at each position are sampled as a step without drafts would sample them
there, with the request's seed at that position (the chunk's last position by the usual sampling row, the others
from the final hidden states here). Draft i is accepted while every draft before it was and the token sampled in
its place equals it; the first token sampled that is not a draft (a mismatch, or the bonus token after k accepted)
ends the row.

That is rejection sampling with a point-mass proposal (n-gram drafts are deterministic): draft d is accepted with
probability p(d), vLLM's min(1, p(d) / q(d)) for q = 1 at d, and on a rejection the token is drawn from p with d
removed and renormalised, the residual max(0, p - q) normalised. So the output distribution is exactly p at every
position, greedy rows get exactly their argmax tokens, and a seeded row samples the very tokens it would without
speculation.
"""
import numpy as np
from tinygrad import Tensor, TinyJit

from tinyvllm.workers.batch_state import RequestState, ScheduledChunk
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.flat_batch import FlatBatch


class DraftLogits:
    """The logits at the positions whose next token is a draft: one TinyJit per (token bucket, padded row count)
    gathers those rows of a forward's final hidden states and runs the head over them."""

    def __init__(self, model):
        self.model = model
        self.jits: dict[tuple[int, int], TinyJit] = {}

    def _head(self, hidden: Tensor, index: Tensor) -> Tensor:
        return self.model.logits(hidden[index]).realize()

    def __call__(self, batch: FlatBatch, hidden: Tensor) -> Tensor | None:
        """[n, V] for the n draft positions of the batch's sampling pieces, in order (None if none has drafts).
        hidden: the forward's final hidden states [T, dim], valid until the next forward. A copy."""
        positions = []
        for piece, offset in zip(batch.pieces, batch.offsets):
            if (k := piece.state.num_drafts) and piece.samples and not piece.pools:  # in batch.sampled's order
                if piece.length < k + 1:
                    raise ValueError(f"{piece.req_id}: its drafts were split across forwards")
                end = offset + piece.length - 1
                positions += range(end - k, end)
        if not positions:
            return None
        rows = 1 << (len(positions) - 1).bit_length()
        index = np.zeros(rows, np.int32)
        index[:len(positions)] = positions
        if (jit := self.jits.get((batch.bucket, rows))) is None:
            jit = self.jits[(batch.bucket, rows)] = TinyJit(self._head)
        # clone, not contiguous: contiguous() of a leading slice is a view of the jit's output buffer, and the
        # sampler's jit, captured on one bucket's buffer, would go on reading it when the next step's draft logits
        # come from another bucket's (stale logits: drafts wrongly accepted)
        return jit(hidden, device_tensor(index))[:len(positions)].clone().realize()


def position_view(state: RequestState, num_tokens: int) -> RequestState:
    """state as the sampler sees it when sampling token index num_tokens (its seed's noise and min_tokens depend on
    the position; requests with penalties get no drafts)."""
    return RequestState(state.token_ids[:num_tokens], state.block_ids, state.sampling, state.seed,
                        state.num_prompt_tokens, state.eos_token_ids)


def verify(sampler, rows: list[ScheduledChunk], tokens: list[int], logits: list[Tensor]) -> list[list[int]]:
    """Per row, the drafts accepted; tokens (sampled at each row's last position) become each row's token after
    them. The drafts leave the requests' tokens."""
    views = []
    for chunk in rows:
        state = chunk.state
        real = len(state.token_ids) - state.num_drafts
        views += [position_view(state, real + j) for j in range(state.num_drafts)]
    logits_all = logits[0] if len(logits) == 1 else Tensor.cat(*logits).realize()
    draft_targets, _ = sampler.sample(views, logits_all)
    accepted_by_row, used = [], 0
    for row, chunk in enumerate(rows):
        state, k = chunk.state, chunk.state.num_drafts
        real = len(state.token_ids) - k
        drafts, targets = state.token_ids[real:], draft_targets[used:used + k] + [tokens[row]]
        used += k
        accepted = 0
        while accepted < k and targets[accepted] == drafts[accepted]:
            accepted += 1
        tokens[row] = targets[accepted]
        accepted_by_row.append(drafts[:accepted])
        del state.token_ids[real:]
        state.num_drafts = 0
    return accepted_by_row
