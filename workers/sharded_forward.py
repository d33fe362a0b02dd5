"""A tensor-parallel rank's forward: its share of every layer, meeting its peers at each reduction point.

tinygrad has no collective between processes, so the forward is cut where the ranks must meet: the embedding
(vocabulary-sharded), each layer's attention output projection and MLP down projection (partial sums), and the
output head (vocabulary-sharded logits, gathered to the rank that samples). Each piece is one TinyJit per token
bucket (and layer); between pieces the partial sums leave the device, are all-reduced through the host group
(workers/collective.py: shared memory) and the residual add happens on the host. That is 2 * layers + 1 exchanges
per forward: correct on any backend, and a faster transport (a device collective) can replace the group later.
"""
import functools

import numpy as np
from tinygrad import Tensor, TinyJit, UOp
from tinygrad.engine.jit import _prepare_jit_inputs

from tinyvllm.workers.attention import PagedAttention
from tinyvllm.workers.device_input import copy_into, device_tensor, host_array
from tinyvllm.workers.flat_batch import FlatBatch


class SharedArguments:
    """One forward's arguments for many captured jits of one signature (a bucket's attention or MLP piece of every
    layer), checked and converted once: TinyJit.__call__ does that on each call (~0.3 ms on a CPU, which 2 x layers
    pieces a step would pay). The arguments' buffers are reused, so the conversion stays valid for the forward."""

    def __init__(self, *args):
        self.args = args
        self.buffers, self.var_vals, self.names, self.input_info = _prepare_jit_inputs(args, {})

    def call(self, jit: TinyJit):
        captured = jit.captured
        if jit.cnt < 2 or captured.expected_names != self.names or captured.expected_input_info != self.input_info:
            return jit(*self.args)  # not captured yet, or another signature: TinyJit's own checks and errors
        jit.cnt += 1
        return captured(self.buffers, self.var_vals)


class ShardedForward:
    def __init__(self, runner):
        self.runner, self.model, self.group = runner, runner.model, runner.group
        self.spec, self.link = runner.spec, runner.link
        self.jits: dict[tuple, TinyJit] = {}

    def _jit(self, key: tuple, body) -> TinyJit:
        if (jit := self.jits.get(key)) is None:
            jit = self.jits[key] = TinyJit(body)
            jit.cnt = 1  # weights and cache are realized: capture on the first call (model_runner.capture_on_next_call)
        return jit

    # ---- jitted pieces --------------------------------------------------------------------------
    def _embed(self, tokens: Tensor) -> Tensor:
        return self.model.embed(tokens).realize()

    def _attention(self, i: int, x: Tensor, positions: Tensor, token_rows: Tensor, tables: Tensor, n_valid: Tensor,
                   nb: UOp) -> Tensor:
        r = self.runner
        attend = PagedAttention(r.cache, tables, token_rows, positions, n_valid, nb, self.model.kernels,
                                self.model.attention_specs)
        out = self.model.attention(i, x, self.model.rope(positions.clip(0, r.max_model_len - 1)), attend).clone()
        Tensor.realize(out, r.cache.layers[i], *r.cache.scales[i:i + 1])
        return out

    def _mlp(self, i: int, x: Tensor) -> Tensor:
        # a copy: a jit whose output is a precompiled function's own output replays wrong values (tinygrad 0.14)
        return self.model.mlp(i, x).clone().realize()

    def _head(self, x: Tensor, sample_index: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.model.final_norm(x)
        logits = self.model.logits(hidden[sample_index])
        Tensor.realize(logits, hidden)
        return logits, hidden

    def _all_logits(self, hidden: Tensor) -> Tensor:
        return self.model.logits(hidden).realize()

    # ---- one forward ----------------------------------------------------------------------------
    def __call__(self, batch: FlatBatch) -> tuple[Tensor | None, Tensor | None]:
        b, reduce = batch.bucket, self.group.all_reduce
        positions, token_rows, tables, n_valid, sample_index, nb = self.runner.batch_inputs(batch)
        if self.spec.first_stage:
            x = reduce(host_array(self._jit((b, "embed"), self._embed)(self.runner.inputs("tokens", batch.tokens))))
        else:
            x = self.link.recv()
        residual = self.runner.inputs("residual", x)
        attention_args = SharedArguments(residual, positions, token_rows, tables, n_valid, nb)
        mlp_args = SharedArguments(residual)
        for i in range(len(self.model.layers)):  # the residual stream on the host, its copy in `residual`
            x = x + reduce(host_array(attention_args.call(self._jit((b, "attention", i),
                                                                   functools.partial(self._attention, i)))))
            copy_into(residual, x)
            x = x + reduce(host_array(mlp_args.call(self._jit((b, "mlp", i), functools.partial(self._mlp, i)))))
            copy_into(residual, x)
        if not self.spec.last_stage:
            self.link.send(x)
            return None, None
        logits, hidden = self._jit((b, "head"), self._head)(residual, sample_index)
        return self._gather_vocab(host_array(logits)), hidden

    def _gather_vocab(self, shard: np.ndarray) -> Tensor | None:
        """The full-vocabulary logits on the rank that samples (None elsewhere), from every rank's shard."""
        shards = self.group.gather(shard)
        if shards is None:
            return None
        return device_tensor(np.concatenate(shards, axis=1)[:, :self.model.cfg.vocab_size])

    def gather_all_logits(self, batch: FlatBatch, hidden: Tensor) -> Tensor | None:
        """Every position's full-vocabulary logits (prompt logprobs), gathered in row chunks that fit the group's
        buffers; every rank of the last stage takes part, the one that samples gets them."""
        shard = host_array(self._jit((batch.bucket, "all_logits"), self._all_logits)(hidden))
        rows = max(1, self.group.max_bytes // max(1, shard.shape[1] * shard.itemsize))
        parts = [self.group.gather(shard[start:start + rows]) for start in range(0, shard.shape[0], rows)]
        if parts[0] is None:
            return None
        full = np.concatenate([np.concatenate(p, axis=1) for p in parts])
        return device_tensor(full[:, :self.model.cfg.vocab_size])
