"""A tiny random Llama as a GGUF file, with the real SmolLM2 tokenizer, for end-to-end tests.

    make_tiny_gguf(tmp_path / "tiny.gguf")

The tokenizer metadata (every `tokenizer.*` key: vocabulary, merges, token types, special ids, chat template)
is copied from the default model's GGUF, so prompts tokenize and chat templates render exactly as they do
for SmolLM2-135M-Instruct; only the weights are random (and tiny), so the server starts and answers in seconds.

The weights are scaled so that greedy decoding wanders over the vocabulary instead of repeating one token:
with tied embeddings the residual stream still holds the last token's embedding, so a plain all-ones
output norm would make the last token the argmax; random signs in the output norm break that.
"""
from __future__ import annotations

import pathlib

import numpy as np

from tests.helpers.gguf_writer import write_gguf

VOCAB_SIZE = 49152


def tokenizer_metadata() -> dict:
    """All tokenizer.* keys of the default model's GGUF (SmolLM2-135M-Instruct)."""
    from tinyvllm.protocol.gguf_file import GGUFFile
    from tinyvllm.protocol.model_path import resolve_model_path
    md = GGUFFile(resolve_model_path(None)).metadata
    return {k: v for k, v in md.items() if k.startswith("tokenizer.")}


def make_wide_gguf(path: str | pathlib.Path, context: int = 2048) -> pathlib.Path:
    """A deeper, wider random Llama with a longer context: a step takes milliseconds, so a long request (1,900
    tokens) stays running for seconds even on a fast machine, and the engine does not outrun the frontend by much."""
    return make_tiny_gguf(path, n_layers=8, dim=512, n_heads=8, n_kv_heads=4, ffn=1024, context=context)


def make_tiny_gguf(path: str | pathlib.Path, seed: int = 0, n_layers: int = 2, dim: int = 64, n_heads: int = 4,
                   n_kv_heads: int = 2, ffn: int = 128, context: int = 512) -> pathlib.Path:
    """Writes a random Llama (tied embeddings, vocab 49152) to `path` and returns the path.

    token_embd is F16, the feed-forward weights Q8_0 (when dim and ffn are multiples of 32), the rest F32.
    """
    rng = np.random.default_rng(seed)
    head_dim = dim // n_heads
    tok_md = tokenizer_metadata()
    assert len(tok_md["tokenizer.ggml.tokens"]) == VOCAB_SIZE
    md = {
        "general.architecture": "llama",
        "general.name": "tinyvllm-e2e-tiny",
        "llama.vocab_size": VOCAB_SIZE,
        "llama.context_length": context,
        "llama.embedding_length": dim,
        "llama.block_count": n_layers,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv_heads,
        "llama.rope.freq_base": 10000.0,
        "llama.rope.dimension_count": head_dim,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        **tok_md,
    }

    def linear(out_dim: int, in_dim: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim)) * gain / np.sqrt(in_dim)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    quant_ffn = "Q8_0" if dim % 32 == 0 and ffn % 32 == 0 else "F32"
    tensors: dict[str, tuple[np.ndarray, str]] = {
        "token_embd.weight": ((rng.standard_normal((VOCAB_SIZE, dim)) * 0.5).astype(np.float32), "F16"),
    }
    for i in range(n_layers):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = (norm(dim), "F32")
        tensors[p + "attn_q.weight"] = (linear(n_heads * head_dim, dim, 2.0), "F32")
        tensors[p + "attn_k.weight"] = (linear(n_kv_heads * head_dim, dim, 2.0), "F32")
        tensors[p + "attn_v.weight"] = (linear(n_kv_heads * head_dim, dim), "F32")
        tensors[p + "attn_output.weight"] = (linear(dim, n_heads * head_dim), "F32")
        tensors[p + "ffn_norm.weight"] = (norm(dim), "F32")
        tensors[p + "ffn_gate.weight"] = (linear(ffn, dim), quant_ffn)
        tensors[p + "ffn_up.weight"] = (linear(ffn, dim), quant_ffn)
        tensors[p + "ffn_down.weight"] = (linear(dim, ffn), quant_ffn)
    # Random signs: the logit of the token just read is no longer ~|e|^2 (see the module docstring).
    tensors["output_norm.weight"] = (rng.standard_normal(dim).astype(np.float32), "F32")
    return write_gguf(path, md, tensors)


def make_shallow_default_gguf(path: str | pathlib.Path, n_layers: int = 4) -> pathlib.Path:
    """The default model (SmolLM2-135M-Instruct: its tokenizer, heads, widths and stored weights) cut to its
    first n_layers of 30, for tests that need its real shapes and weights but not its depth: a step costs about
    n_layers/30 of the whole model's, in compute and in capture."""
    from tinyvllm.protocol.gguf_file import GGUFFile
    from tinyvllm.protocol.model_path import resolve_model_path
    from tests.helpers.gguf_writer import Raw
    src = GGUFFile(resolve_model_path(None))
    metadata = {**src.metadata, "llama.block_count": n_layers}
    metadata.pop("general.alignment", None)
    kept = [name for name in src.tensor_names
            if not name.startswith("blk.") or int(name.split(".")[1]) < n_layers]
    return write_gguf(path, metadata, {name: (Raw(src.raw(name), src.tensor_shape(name)), src.tensor_type(name))
                                       for name in kept})
