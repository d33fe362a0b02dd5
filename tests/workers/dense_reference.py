"""An independent float64 numpy Llama forward over whole sequences: no cache, no paging, no tinygrad."""
import numpy as np


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (np.arange(half) * 2 / x.shape[-1])
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def dense_logits(cfg, w: dict, tokens: list[int]) -> np.ndarray:
    """Logits [T, vocab] for every position of `tokens`."""
    return dense_hidden(cfg, w, tokens) @ w.get("output.weight", w["token_embd.weight"]).astype(np.float64).T


def dense_hidden(cfg, w: dict, tokens: list[int]) -> np.ndarray:
    """The final hidden states [T, dim] (after the final norm) for every position of `tokens`."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T, H, KVH, D = len(tokens), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pos = np.arange(T)
    x = w["token_embd.weight"][tokens]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(T, H, D), pos, cfg.rope_theta)
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(T, KVH, D), pos, cfg.rope_theta)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KVH, D)
        k, v = np.repeat(k, H // KVH, axis=1), np.repeat(v, H // KVH, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
        x = x + attn @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"], cfg.rms_eps)


def random_llama(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def mat(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    D, H, KVH = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    w = {"token_embd.weight": mat(cfg.vocab_size, cfg.dim, scale=1.0),
         "output_norm.weight": (1 + mat(cfg.dim, scale=0.1))}
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        w.update({p + "attn_norm.weight": 1 + mat(cfg.dim, scale=0.1), p + "ffn_norm.weight": 1 + mat(cfg.dim, scale=0.1),
                  p + "attn_q.weight": mat(H * D, cfg.dim), p + "attn_k.weight": mat(KVH * D, cfg.dim),
                  p + "attn_v.weight": mat(KVH * D, cfg.dim), p + "attn_output.weight": mat(cfg.dim, H * D),
                  p + "ffn_gate.weight": mat(cfg.ffn_dim, cfg.dim), p + "ffn_up.weight": mat(cfg.ffn_dim, cfg.dim),
                  p + "ffn_down.weight": mat(cfg.dim, cfg.ffn_dim)})
    return w
