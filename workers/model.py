"""A Llama-family transformer (Llama, SmolLM2, Qwen2/3, Mistral, Phi-3, Gemma 2/3) in tinygrad, reading and writing
a paged KV cache.

A step is one flat batch of tokens (decodes and prompt chunks of many sequences alike); how a layer's attention
reaches the cache, workers/attention.py supplies. Each layer has two reduction points, the outputs of the attention
output projection and of the MLP's down projection: where tensor-parallel ranks all-reduce their partial sums
(`attention` and `mlp` return them; `run_layers` composes the layers when no rank needs to meet another).

Weights are workers.quantized_weight.DeviceWeight: GGUF Q4_1/Q8_0 matrices stay quantised on the device
and every matmul reads `w.dequantized()`, which tinygrad fuses into the matmul kernel (see `linear`).
"""
import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.function import function

from tinyvllm.protocol.kernel_choice import KernelChoice
from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.cpu_matmul import cpu_linear, shared_int8_tiles
from tinyvllm.workers.cpu_matvec import c_kernels_support, cpu_expert_matvec
from tinyvllm.workers.cpu_swiglu import cpu_swiglu
from tinyvllm.workers.gpu_gemm import gpu_gemm, gpu_gemm_fits, half_scratch_product
from tinyvllm.workers.gpu_matvec import GPU_MATVEC_MAX_ROWS, gpu_matvec, gpu_matvec_fits
from tinyvllm.workers.kernel_set import kernel_choice
from tinyvllm.workers.lora import ATTENTION, MLP, LoRAWeights
from tinyvllm.workers.product_ends import AS_THEY_ARE, RowInput, inv_rms
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.rope_scaling import rope_frequencies
from tinyvllm.workers.quantized_weight import DeviceWeight
from tinyvllm.workers.weight_pack import WeightPack
from tinyvllm.workers.weights import EXPERT_MATRICES


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * inv_rms(x, eps) * weight


def rope_tables(cfg: ModelConfig, max_positions: int, freq_factors=None, local: bool = False) -> tuple[Tensor, Tensor]:
    """cos and sin [max_positions, head_dim / 2], RoPE scaling included (protocol/rope_scaling.py); freq_factors:
    a GGUF's rope_freqs.weight. local: the tables of sliding-window layers with a base of their own (Gemma 3)."""
    theta, scaling = (cfg.rope_local_theta, None) if local else (cfg.rope_theta, cfg.rope_scaling)
    inv_freq, factor = rope_frequencies(cfg.head_dim, theta, scaling, cfg.max_context, None if local else freq_factors)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return (Tensor((np.cos(angles) * factor).astype(np.float32)).realize(),
            Tensor((np.sin(angles) * factor).astype(np.float32)).realize())


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim/2]. HF rotate_half convention."""
    half = x.shape[-1] // 2
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x[..., :half], x[..., half:]
    return (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)


def joined_products(weights: list[DeviceWeight], join: bool) -> tuple[DeviceWeight, ...]:
    """The products of one input (q, k and v; gate and up) as the fewest weights: each run of weights of one kind and
    layout concatenated, rows after rows (join=False: as they are)."""
    runs: list[list[DeviceWeight]] = []
    for w in weights:
        if join and runs and runs[-1][0].joins(w):
            runs[-1].append(w)
        else:
            runs.append([w])
    return tuple(run[0] if len(run) == 1 else DeviceWeight.concatenated(run) for run in runs)


def split_products(outputs: list[Tensor], sizes: tuple[int, ...]) -> list[Tensor]:
    """The outputs [T, rows] of joined_products' weights, cut into the products of `sizes` rows each."""
    parts = []
    for out in outputs:
        start = 0
        while start < out.shape[1]:
            parts.append(out[:, start:start + sizes[len(parts)]])
            start += sizes[len(parts) - 1]
        assert start == out.shape[1], (out.shape, sizes)
    assert len(parts) == len(sizes), (len(parts), sizes)
    return parts


class Layer:
    def __init__(self, cfg: ModelConfig, w: dict[str, DeviceWeight], i: int, join_products: bool = False):
        """join_products: q, k and v, and gate and up, as one weight each where their layouts match (each pair
        taken out of `w` as it is joined, so a model's load holds one layer's copy at a time)."""
        p = f"blk.{i}."
        self.attn_norm, self.ffn_norm = w[p + "attn_norm.weight"].dequantized(), w[p + "ffn_norm.weight"].dequantized()
        take = (lambda name: w.pop(name)) if join_products else (lambda name: w[name])
        self.qkv = joined_products([take(p + f"attn_{n}.weight") for n in ("q", "k", "v")], join_products)
        self.wo = w[p + "attn_output.weight"]
        self.biases = tuple(b.dequantized() for n in ("q", "k", "v") if (b := w.get(p + f"attn_{n}.bias")) is not None)
        self.output_bias = (w[p + "attn_output.bias"].dequantized(),) if cfg.output_bias else ()
        self.sinks = w[p + "attn_sinks.weight"].dequantized() if cfg.attention_sinks else None
        self.qk_norms = tuple(x.dequantized() for n in ("q", "k") if (x := w.get(p + f"attn_{n}_norm.weight")) is not None)
        if cfg.n_experts:  # the router [n_experts, dim]; each FFN matrix of all experts, their rows one after another
            self.router = w[p + "ffn_gate_inp.weight"].dequantized()
            self.w_gate, self.w_up, self.w_down = (w[p + f"{n}.weight"] for n in EXPERT_MATRICES)
            self.expert_biases = tuple(w[p + f"{n}.bias"].dequantized() for n in ("ffn_gate_inp", *EXPERT_MATRICES)
                                       if cfg.expert_bias)
        else:
            self.gate_up = joined_products([take(p + f"ffn_{n}.weight") for n in ("gate", "up")], join_products)
            self.w_down = w[p + "ffn_down.weight"]
        # Gemma's norms of the attention and MLP outputs, before each joins the residual stream
        self.post_attn_norm, self.post_ffn_norm = (tuple(x.dequantized() for x in [w.get(p + name)] if x is not None)
                                                   for name in ("post_attention_norm.weight", "post_ffw_norm.weight"))


FUSED_DEQUANT_MAX_ROWS = 8  # with tinygrad's own CPU kernels fused beat the scratch copy up to 8 rows, ~1.4x slower at 16


def linear(h: Tensor, w: DeviceWeight, kernels: KernelChoice, max_fused_rows: int = FUSED_DEQUANT_MAX_ROWS,
           tiles: Tensor | None = None, rows_in: RowInput = AS_THEY_ARE) -> Tensor:
    """h @ w.T. C matmuls (the "c" and "c-int8" sets, tinygrad's CPU backend): workers/cpu_matmul.py's kernels, with
    int8 activations for Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_0 products where the set says so; tiles: h already
    quantised for them (workers/cpu_matmul.py's shared_int8_tiles). Otherwise, for up to max_fused_rows rows of h (decode) the
    dequantisation is fused into the matmul's loads; for more rows (larger batches, prefill) the fused kernel would
    redo it for every few rows, so the weight is dequantised once into a scratch float32 buffer first (h.shape is
    static: each jitted step picks one). A 16-bit float weight is only widened: always fused. kernels.gpu_matvec (a
    device with local memory): decode rows take workers/gpu_matvec.py's kernels in kernels.matvec_layout.
    kernels.tensor_cores (a device with half tensor cores): more rows take workers/gpu_gemm.py's kernels, the weight
    dequantised inside them, and the kinds those do not read go through a half scratch instead of a float32 one.
    rows_in: h's RMSNorm or SwiGLU (workers/product_ends.py), applied inside the GPU kernels where they take the
    product, else by tinygrad."""
    if kernels.matmul == "c":
        return cpu_linear(rows_in.applied(h), w, kernels.int8_activations, tiles)
    if kernels.gpu_matvec and gpu_matvec_fits(h, w, kernels.matvec_layout):
        return gpu_matvec(h, w, kernels.matvec_layout, rows_in)
    if kernels.tensor_cores and h.shape[0] > GPU_MATVEC_MAX_ROWS and gpu_gemm_fits(h, w, rows_in):
        return gpu_gemm(h, w, kernels.bfloat16_tensor_cores if w.kind == "BF16" else True, rows_in)
    fused = h.shape[0] <= max_fused_rows or w.kind in ("F32", "F16", "BF16")
    if kernels.tensor_cores and not fused:
        return half_scratch_product(h, w, rows_in=rows_in)
    h, weight = rows_in.applied(h), w.dequantized()
    return h @ (weight if fused else weight.contiguous()).T


def make_layer_functions(cfg: ModelConfig, kernels: KernelChoice, max_fused_rows: int = FUSED_DEQUANT_MAX_ROWS,
                         lora: bool = False):
    """The dense halves of a layer as tinygrad functions: weights are explicit arguments (a DeviceWeight's
    Tensors become arguments too), so all layers share one graph and tinygrad schedules and compiles it once
    instead of once per layer (once per combination of weight kinds, if layers are quantised differently).
    lora: each function's last arguments are the step's LoRA mask and, per product, its layer's A and B
    (workers/lora.py), whose term joins the product."""
    def lora_term(h: Tensor, adapter: tuple) -> Tensor:
        mask, a, bt = adapter  # every slot's A and B^T; the mask keeps each row's own slot's columns
        return linear(linear(h, a, kernels, max_fused_rows) * mask, bt, kernels, max_fused_rows)

    def lin(h: Tensor, w: DeviceWeight, adapter: tuple = ()) -> Tensor:
        out = linear(h, w, kernels, max_fused_rows)
        return out + lora_term(h, adapter) if adapter else out

    def split_lora(extras: tuple, products: int) -> tuple[tuple, list[tuple]]:
        """(the other extras, each product's (mask, A, B)); no adapters without lora."""
        if not lora:
            return extras, [()] * products
        n = 1 + 2 * products
        mask, ab = extras[-n], extras[-n + 1:]
        return extras[:-n], [(mask, ab[2 * i], ab[2 * i + 1]) for i in range(products)]

    def shared_tiles(h: Tensor, *ws: DeviceWeight) -> Tensor | None:  # h quantised once for its products
        return shared_int8_tiles(h, ws, kernels.int8_activations) if kernels.matmul == "c" else None

    custom_kernels = kernels.matmul == "c" or kernels.gpu_matvec or kernels.tensor_cores

    def normed(x: Tensor, norm: Tensor) -> RowInput:  # the RMSNorm of x, for a GPU product to apply as it loads x
        return RowInput(norm=(inv_rms(x, cfg.rms_eps), norm))

    def products(x: Tensor, norm: Tensor, weights: tuple[DeviceWeight, ...], sizes: tuple[int, ...],
                 adapters: list[tuple]) -> list[Tensor]:
        """The RMSNorm of x times joined_products' weights, one product per size, each with its LoRA term. On a GPU
        (without adapters) the norm is applied inside the product kernels (workers/product_ends.py)."""
        if kernels.gpu_matvec and not any(adapters):
            rows_in = normed(x, norm)
            return split_products([linear(x, w, kernels, max_fused_rows, rows_in=rows_in) for w in weights], sizes)
        h = rms_norm(x, norm, cfg.rms_eps)
        if len(weights) > 1:
            h = h.contiguous()  # else each product recomputes the norm
        tiles = shared_tiles(h, *weights)
        outputs = split_products([linear(h, w, kernels, max_fused_rows, tiles) for w in weights], sizes)
        return [out + lora_term(h, adapter) if adapter else out for out, adapter in zip(outputs, adapters)]

    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    @function(precompile=True, allow_implicit=custom_kernels)
    def qkv(x, cos, sin, norm, weights, *extras):
        """weights: q, k and v's (joined_products); extras: the q, k and v biases (cfg.attention_bias), then the q and
        k norms (cfg.qk_norm)."""
        extras, adapters = split_lora(extras, 3)
        T = x.shape[0]
        q, k, v = products(x, norm, weights, (q_rows, kv_rows, kv_rows), adapters)
        if cfg.attention_bias:
            q, k, v = q + extras[0], k + extras[1], v + extras[2]
        q, k = q.reshape(T, cfg.n_heads, cfg.head_dim), k.reshape(T, cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q_norm, k_norm = extras[-2:]
            q, k = rms_norm(q, q_norm, cfg.rms_eps), rms_norm(k, k_norm, cfg.rms_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.contiguous(), Tensor.stack(k, v.reshape(T, cfg.n_kv_heads, cfg.head_dim), dim=1).contiguous()

    def post_norm(x: Tensor, post: tuple) -> Tensor:
        return rms_norm(x, post[0], cfg.rms_eps) if post else x

    def joined(out: Tensor, residual: Tensor | None) -> Tensor:
        """A function's output, added to the residual stream where no rank meets another first: the add is then the
        function's last kernel (a product's own output, returned, would be copied into the function's)."""
        return out if residual is None else residual + out

    @function(precompile=True, allow_implicit=custom_kernels)
    def attn_out(attn, wo, *extras, residual=None):
        """extras: the output's bias (cfg.output_bias), then Gemma's norm of the output."""
        extras, (adapter,) = split_lora(extras, 1)
        out = lin(attn, wo, adapter=adapter)
        return joined(post_norm(out + extras[0], extras[1:]) if cfg.output_bias else post_norm(out, extras), residual)

    @function(precompile=True, allow_implicit=custom_kernels)
    def mlp(x, norm, gate_up, w_down, *post, residual=None):
        """gate_up: gate and up's weights (joined_products); post: Gemma's norm of the output."""
        post, (gate_adapter, up_adapter, down_adapter) = split_lora(post, 3)
        if kernels.gpu_matvec and len(gate_up) == 1 and cfg.hidden_act != "gelu_tanh" and not lora:
            # on a GPU the down product takes silu(gate) * up from the joined product's rows as it loads them
            rows = linear(x, gate_up[0], kernels, max_fused_rows, rows_in=normed(x, norm))
            return joined(post_norm(linear(rows, w_down, kernels, max_fused_rows, rows_in=RowInput(swiglu=True)), post),
                          residual)
        gate, up = products(x, norm, gate_up, (cfg.ffn_dim, cfg.ffn_dim), [gate_adapter, up_adapter])
        if cfg.hidden_act == "gelu_tanh":
            act = gate.gelu() * up  # tinygrad's gelu: the tanh form
        else:
            act = cpu_swiglu(gate, up) if kernels.matmul == "c" else gate.silu() * up
        return joined(post_norm(lin(act, w_down, adapter=down_adapter), post), residual)

    @function(precompile=True, allow_implicit=custom_kernels)
    def experts(x, norm, router, w_gate, w_up, w_down, *extras, residual=None):
        """A mixture-of-experts MLP: each token's n_experts_used experts, summed weighted by their router
        probabilities. A product reads only the rows of the experts its token was routed to (decode reads the active
        parameters): the C kernels' expert variants (workers/cpu_matvec.cpu_expert_matvec) where they take the
        matrix, else tinygrad's gather of those rows from the expert matrices, folded into the product's loads.
        extras: the router's and the expert matrices' biases (cfg.expert_bias: gpt-oss), then Gemma's output norm."""
        T, k, ff, dim = x.shape[0], cfg.n_experts_used, cfg.expert_ffn_dim, cfg.dim
        biases, post = (extras[:4], extras[4:]) if cfg.expert_bias else (None, extras)
        h = rms_norm(x, norm, cfg.rms_eps).contiguous()
        logits = h @ router.T
        probs = (logits + biases[0] if biases else logits).softmax(-1)
        top, chosen = probs.topk(k)
        if cfg.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        chosen = chosen.cast(dtypes.int32)  # [T, k]
        pairs = chosen.reshape(T * k).contiguous()

        def product(inputs: Tensor, w: DeviceWeight, rows_per_expert: int) -> Tensor:  # [T, k, K] -> [T, k, rows]
            if kernels.matmul == "c" and c_kernels_support(w):
                flat = inputs.reshape(T * k, inputs.shape[-1]).contiguous()
                return cpu_expert_matvec(flat, w, pairs, rows_per_expert, kernels.int8_activations).reshape(T, k, -1)
            rows = chosen.unsqueeze(-1) * rows_per_expert + Tensor.arange(rows_per_expert, dtype=dtypes.int32)
            return (inputs.unsqueeze(2) * w.rows(rows)).sum(-1)

        wide = h.unsqueeze(1).expand(T, k, dim)
        gate, up = product(wide, w_gate, ff), product(wide, w_up, ff)
        if biases:
            gate, up = gate + biases[1][chosen], up + biases[2][chosen]
        if cfg.swiglu_limit:  # gpt-oss's
            gate, up = gate.clip(max_=cfg.swiglu_limit), up.clip(-cfg.swiglu_limit, cfg.swiglu_limit)
            act = ((up + 1) * (gate * (gate * 1.702).sigmoid())).contiguous()
        else:
            act = (gate.silu() * up).contiguous()
        down = product(act, w_down, dim)
        if biases:
            down = down + biases[3][chosen]
        return joined(post_norm((down * top.unsqueeze(-1)).sum(1), post), residual)

    return qkv, attn_out, mlp if not cfg.n_experts else experts


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict, max_positions: int, kernels: str | KernelChoice | None = None,
                 dtype: str = "auto", vocab_start: int | None = None,
                 max_fused_rows: int = FUSED_DEQUANT_MAX_ROWS, weight_pack: WeightPack | None = None):
        """weights: load_weights' dict (float32 arrays or QuantizedArrays), or one worker's share of it
        (workers/tensor_parallel.py: a pipeline stage's layers, a tensor-parallel rank's slices; then cfg is the
        shard's and vocab_start the first token id of its embedding/head rows). kernels: the kernels the model
        traces, a KernelChoice or a set's name (protocol/kernel_choice.py; default: the device's default set),
        resolved for the device into `self.kernels` (workers/kernel_set.py). dtype: the weights' width on the device
        (--dtype, DeviceWeight.from_host; the C kernels take rows of whole 32-blocks, so a 16-bit matrix of another
        width is widened for them). max_fused_rows: see `linear` (tinygrad's kernels). weight_pack: the model's packs
        (--load-format, workers/weight_pack.py): the weights are mapped from the pack of this layout."""
        self.cfg, self.vocab_start = cfg, vocab_start
        self.kernels = kernel_choice(Device.DEFAULT, kernels)
        c_matmul = self.kernels.matmul == "c"
        # the C kernels read rows of whole 32-element blocks: a 16-bit matrix of another width is widened at load
        widen = lambda arr: c_matmul and arr.ndim == 2 and arr.shape[1] % 32 != 0
        width = lambda arr: "float32" if widen(arr) else dtype
        layout = {"dtype": dtype, "words": self.kernels.gpu_matvec, "c_matmul": c_matmul}
        w = weight_pack and weight_pack.device_weights(
            weights, layout, lambda name, arr: DeviceWeight.host_parts(arr, width(arr), self.kernels.gpu_matvec))
        if w is None:
            w = {name: DeviceWeight.from_host(arr, width(arr), words=self.kernels.gpu_matvec)
                 for name, arr in weights.items()}
        self.tok_embeddings = w.get("token_embd.weight")  # a later pipeline stage has none, unless it is tied
        self.output = w.get("output.weight", self.tok_embeddings)
        self.norm = w["output_norm.weight"].dequantized() if "output_norm.weight" in w else None  # last stage only
        self.weight_nbytes = sum(x.nbytes for x in w.values())  # bytes of weights on the device
        # on a GPU (local memory) q, k and v, and gate and up, are one product each: fewer, larger kernels per step
        self.layers = [Layer(cfg, w, i, join_products=self.kernels.gpu_matvec) for i in range(cfg.n_layers)]
        self.cos, self.sin = rope_tables(cfg, max_positions, weights.get("rope_freqs.weight"))
        self.local_rope = rope_tables(cfg, max_positions, local=True) if cfg.rope_local_theta else None
        self.attention_specs = [AttentionSpec(cfg.scale, cfg.window(i), cfg.attn_softcap) for i in range(cfg.n_layers)]
        self.max_fused_rows = max_fused_rows
        self._qkv, self._attn_out, self._mlp = make_layer_functions(cfg, self.kernels, max_fused_rows)
        self.lora: LoRAWeights | None = None

    def serve_adapters(self, slots: int, rank: int) -> None:
        """From now on every product takes LoRA adapters' terms (workers/lora.py): run_layers needs a lora_mask."""
        self.lora = LoRAWeights(self.cfg, slots, rank)
        self._qkv, self._attn_out, self._mlp = make_layer_functions(self.cfg, self.kernels, self.max_fused_rows,
                                                                    lora=True)

    def forward(self, tokens: Tensor, positions: Tensor, attend) -> Tensor:
        """The whole model, unsharded: hidden states [T, dim] after the final norm.

        attend(layer_index, q [T, heads, hd], kv [T, 2, kv_heads, hd]) -> [T, heads * hd] writes the new
        keys and values into the paged cache and attends over the sequence's context."""
        return self.final_norm(self.run_layers(self.embed(tokens), positions, attend))

    # ---- the pieces, between the points where tensor-parallel ranks all-reduce --------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        """[T, dim]; with a vocabulary shard, the rows of the tokens it holds and zeros elsewhere (a partial sum)."""
        if self.vocab_start is None:
            rows = self.tok_embeddings.rows(tokens)
            return rows * self.cfg.embed_scale if self.cfg.embed_scale != 1.0 else rows
        local = tokens - self.vocab_start
        inside = (local >= 0) & (local < self.tok_embeddings.shape[0])
        return self.tok_embeddings.rows(inside.where(local, 0)) * (inside.unsqueeze(-1).cast(dtypes.float32) *
                                                                   self.cfg.embed_scale)

    def rope(self, positions: Tensor) -> dict[bool, tuple[Tensor, Tensor]]:
        """The cos and sin of the positions, by whether a layer is a sliding-window one."""
        full = self.cos[positions], self.sin[positions]
        local = full if self.local_rope is None else (self.local_rope[0][positions], self.local_rope[1][positions])
        return {False: full, True: local}

    def _adapters(self, i: int, modules: tuple[str, ...], lora_mask: Tensor | None) -> list[Tensor]:
        return [lora_mask, *self.lora.args(i, modules)] if self.lora is not None else []

    def attention(self, i: int, x: Tensor, rope: dict, attend, lora_mask: Tensor | None = None,
                  residual: Tensor | None = None) -> Tensor:
        """Layer i's attention output projection of x (a partial sum on a tensor-parallel rank), plus `residual`."""
        layer, cos_sin = self.layers[i], rope[self.cfg.window(i) > 0]
        q, kv = self._qkv(x, *cos_sin, layer.attn_norm, layer.qkv, *layer.biases, *layer.qk_norms,
                          *self._adapters(i, ATTENTION, lora_mask))
        attended = attend(i, q, kv) if layer.sinks is None else attend(i, q, kv, sinks=layer.sinks)
        return self._attn_out(attended, layer.wo, *layer.output_bias, *layer.post_attn_norm,
                              *self._adapters(i, ("o",), lora_mask), residual=residual)

    def mlp(self, i: int, x: Tensor, lora_mask: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
        """Layer i's MLP output for x (a partial sum on a tensor-parallel rank), plus `residual`."""
        layer, extras = self.layers[i], (*self._adapters(i, MLP, lora_mask),)
        if self.cfg.n_experts:
            return self._mlp(x, layer.ffn_norm, layer.router, layer.w_gate, layer.w_up, layer.w_down,
                             *layer.expert_biases, *layer.post_ffn_norm, *extras, residual=residual)
        return self._mlp(x, layer.ffn_norm, layer.gate_up, layer.w_down, *layer.post_ffn_norm, *extras,
                         residual=residual)

    def run_layers(self, x: Tensor, positions: Tensor, attend, lora_mask: Tensor | None = None) -> Tensor:
        """This model's layers over the residual stream x, without the final norm (a pipeline stage's work).
        lora_mask: with adapters, each token's slot columns (workers/lora.py)."""
        rope = self.rope(positions)
        for i in range(len(self.layers)):
            x = self.attention(i, x, rope, attend, lora_mask, residual=x)
            x = self.mlp(i, x, lora_mask, residual=x)
        return x

    def final_norm(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.norm, self.cfg.rms_eps)

    def logits(self, hidden: Tensor) -> Tensor:
        """[R, V] (a tensor-parallel rank: its vocabulary shard's columns)."""
        # always fused: the scratch float32 copy of a tied embedding would be vocab x dim x 4 bytes per jitted step
        logits = linear(hidden, self.output, self.kernels, max_fused_rows=hidden.shape[0])
        cap = self.cfg.final_softcap
        return (logits / cap).tanh() * cap if cap else logits
