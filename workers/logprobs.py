"""Log-probabilities on the device: the chosen tokens' and the top-k, from the raw logits (vLLM's default
logprobs_mode, raw_logprobs: log_softmax of the model's logits before any processing or temperature)."""
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.messages import TokenLogprobs

TOP_COUNT_BUCKETS = (5, 20)  # one compiled variant per bucket, not per requested k


def top_count_bucket(k: int) -> int:
    return next(b for b in TOP_COUNT_BUCKETS if b >= k)


def logprobs_of(logits: Tensor, chosen_ids: Tensor, k: int) -> tuple[Tensor, ...]:
    """logits [R, V], chosen_ids [R] -> (chosen logprob [R], and when k > 0: top ids [R, k] int32, top logprobs
    [R, k]). The top-k is k rounds of argmax-and-mask, much cheaper than sorting the vocabulary."""
    lp = logits.cast(dtypes.float32).log_softmax(-1)
    cols = Tensor.arange(lp.shape[-1], dtype=dtypes.int32).reshape(1, -1)
    chosen = (cols == chosen_ids.cast(dtypes.int32).reshape(-1, 1)).where(lp, 0.0).sum(-1)
    if k == 0:
        return (chosen,)
    ids, values, rest = [], [], lp
    for _ in range(k):
        best = rest.argmax(-1).cast(dtypes.int32)
        ids.append(best)
        values.append(rest.max(-1))
        rest = (cols == best.reshape(-1, 1)).where(-float("inf"), rest).contiguous()
    return chosen, Tensor.stack(*ids, dim=1), Tensor.stack(*values, dim=1)


def to_token_logprobs(chosen_ids: list[int], chosen_lp: list[float], top_ids: list[list[int]] | None,
                      top_lp: list[list[float]] | None, k: int) -> list[TokenLogprobs]:
    """Host-side rows of logprobs_of's outputs -> protocol entries with each row's top k (k <= the bucket)."""
    return [TokenLogprobs(int(t), float(lp), [int(i) for i in top_ids[j][:k]] if k else [],
                          [float(v) for v in top_lp[j][:k]] if k else [])
            for j, (t, lp) in enumerate(zip(chosen_ids, chosen_lp))]
