"""A GGUF with a real model's shapes and synthetic weights, made from a description of a few lines: the models
people serve on GPUs, generated on a device machine that reaches no hub (nothing large travels there).

    python benchmarks/shape_twin.py --shape llama-3-8b --type Q8_0 --tokenizer-from smollm2.gguf OUT.gguf

The metadata and tensor shapes are the model's (its llama.cpp conversion: names, layer count, heads, vocabulary
rows, llama3 rope frequencies); every matrix is of --type (F16, BF16, Q8_0, Q4_1, the K-quants and IQ4 types the
device keeps compact, or the Q4_K_M or Q5_K_M mix as llama-quantize assigns it), norms F32. The tokenizer is the
--tokenizer-from file's (the real one does not travel): ids past its vocabulary exist in the embedding but are never
produced by encoding; --tokenizer-vocab cuts the embedding (and output head) to that vocabulary instead, as llama.cpp
requires (it checks the rows against the tokenizer's tokens), for files llama-server serves too. The weights are benchmarks/gguf_twin.py's seeded block patterns, so the text is gibberish: use it for
speed only.
"""
import argparse
import importlib.util
import pathlib
import sys

import numpy as np

from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGML_TYPES, GGUFFile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers.gguf_writer import ALIGNMENT, gguf_header  # noqa: E402

_spec = importlib.util.spec_from_file_location("gguf_twin", pathlib.Path(__file__).parent / "gguf_twin.py")
gguf_twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gguf_twin)

# From each model's config.json (Hugging Face) and its llama.cpp conversion.
SHAPES = {
    "llama-3.2-1b": dict(dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, context=131072,
                         tied=True, llama3_rope=(32.0, 1.0, 4.0, 8192)),
    "llama-3-8b": dict(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, context=8192,
                       tied=False, llama3_rope=None),
    # a mixture of experts: 128 experts of width 768, 8 per token; q/k norms, a head_dim that is not dim / heads
    "qwen3-30b-a3b": dict(arch="qwen3moe", dim=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                          experts=128, experts_used=8, expert_ffn=768, vocab=151936, context=40960, tied=False,
                          llama3_rope=None, rope_theta=1000000.0),
}
CHUNK = 1 << 26  # bytes written at a time


def llama3_rope_factors(head_dim: int, theta: float, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's conversion writes it for Llama 3.1+ (the divisor of each frequency)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    out = np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


# llama-quantize's mixes: (most matrices, the ones given more bits)
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}


def matrix_type(mix_or_type: str, name: str, layers: int, tied: bool) -> str:
    """A matrix's type: the type itself, or as llama-quantize's mix assigns it (Q4_K_M: Q6_K for the output head,
    and for attn_v and ffn_down in the first and last eighth of the layers and every third between)."""
    if mix_or_type not in MIXES:
        return mix_or_type
    most, more = MIXES[mix_or_type]
    if name == "output.weight" or name == "token_embd.weight" and tied:
        return more
    if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        i = int(name.split(".")[1])
        return more if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2 else most
    return most


def tensor_specs(s: dict, mix_or_type: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, numpy-order shape, type) of every tensor, in llama.cpp's order."""
    head_dim = s.get("head_dim", s["dim"] // s["heads"])
    mat = lambda name, rows, cols: (name, (rows, cols), matrix_type(mix_or_type, name, s["layers"], s["tied"]))
    experts = lambda name, rows, cols: (name, (s["experts"], rows, cols),
                                        matrix_type(mix_or_type, name, s["layers"], s["tied"]))
    specs = [mat("token_embd.weight", s["vocab"], s["dim"])]
    if s["llama3_rope"]:
        specs.append(("rope_freqs.weight", (head_dim // 2,), "F32"))
    for i in range(s["layers"]):
        p = f"blk.{i}."
        specs += [(p + "attn_norm.weight", (s["dim"],), "F32"),
                  mat(p + "attn_q.weight", s["heads"] * head_dim, s["dim"]),
                  mat(p + "attn_k.weight", s["kv_heads"] * head_dim, s["dim"]),
                  mat(p + "attn_v.weight", s["kv_heads"] * head_dim, s["dim"]),
                  mat(p + "attn_output.weight", s["dim"], s["heads"] * head_dim)]
        if s.get("experts"):
            specs += [(p + "attn_q_norm.weight", (head_dim,), "F32"), (p + "attn_k_norm.weight", (head_dim,), "F32"),
                      (p + "ffn_norm.weight", (s["dim"],), "F32"),
                      (p + "ffn_gate_inp.weight", (s["experts"], s["dim"]), "F32"),
                      experts(p + "ffn_gate_exps.weight", s["expert_ffn"], s["dim"]),
                      experts(p + "ffn_up_exps.weight", s["expert_ffn"], s["dim"]),
                      experts(p + "ffn_down_exps.weight", s["dim"], s["expert_ffn"])]
        else:
            specs += [(p + "ffn_norm.weight", (s["dim"],), "F32"), mat(p + "ffn_gate.weight", s["ffn"], s["dim"]),
                      mat(p + "ffn_up.weight", s["ffn"], s["dim"]), mat(p + "ffn_down.weight", s["dim"], s["ffn"])]
    specs.append(("output_norm.weight", (s["dim"],), "F32"))
    if not s["tied"]:
        specs.append(mat("output.weight", s["vocab"], s["dim"]))
    return specs


def metadata(name: str, s: dict, tokenizer: dict) -> dict:
    a, head_dim = s.get("arch", "llama"), s.get("head_dim", s["dim"] // s["heads"])
    md = {"general.architecture": a, "general.name": f"{name} shape twin", f"{a}.vocab_size": s["vocab"],
          f"{a}.context_length": s["context"], f"{a}.embedding_length": s["dim"], f"{a}.block_count": s["layers"],
          f"{a}.feed_forward_length": s["ffn"], f"{a}.attention.head_count": s["heads"],
          f"{a}.attention.head_count_kv": s["kv_heads"], f"{a}.rope.freq_base": s.get("rope_theta", 500000.0),
          f"{a}.attention.layer_norm_rms_epsilon": 1e-5 if a == "llama" else 1e-6,
          f"{a}.rope.dimension_count": head_dim, f"{a}.attention.key_length": head_dim,
          f"{a}.attention.value_length": head_dim}
    if s.get("experts"):
        md |= {f"{a}.expert_count": s["experts"], f"{a}.expert_used_count": s["experts_used"],
               f"{a}.expert_feed_forward_length": s["expert_ffn"]}
    return md | {k: v for k, v in tokenizer.items() if k.startswith("tokenizer.")}


def nbytes(shape: tuple[int, ...], type_name: str) -> int:
    _, block_elems, block_bytes = GGML_TYPES[GGML_TYPE_IDS[type_name]]
    return int(np.prod(shape)) // block_elems * block_bytes


def byte_level_bytes(token: str) -> bytes:
    """A byte-level BPE token's bytes (GPT-2's byte-to-character map inverted: bytes that are not printable Latin-1
    are the characters from U+0100 on, in order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    to_byte = {chr(b): b for b in printable} | {chr(0x100 + i): b for i, b in enumerate(others)}
    return bytes(to_byte.get(c, 0x80) for c in token)  # a character outside the map: not ASCII either


def ascii_rows(tokens: list[str]) -> np.ndarray:
    """Whether each token's bytes are all ASCII."""
    return np.array([max(byte_level_bytes(t), default=0) < 0x80 for t in tokens])


def make_shape_twin(shape: dict, name: str, matrix_type: str, tokenizer_from: str, out: str, seed: int = 0,
                    tokenizer_vocab: bool = False, layers: int | None = None, ascii_output: bool = False) -> None:
    """ascii_output: the output head's rows of tokens that are not all ASCII bytes are zero, so greedy decoding
    (logits of the others are rarely all below 0) emits whole characters: llama-server's build answers 500 to a
    completion that ends inside a UTF-8 character."""
    tokenizer = GGUFFile(tokenizer_from).metadata
    if tokenizer_vocab:
        shape = shape | {"vocab": len(tokenizer["tokenizer.ggml.tokens"])}
    if layers:
        shape = shape | {"layers": layers}
    specs = tensor_specs(shape, matrix_type)
    rng, patterns = np.random.default_rng(seed), {}
    rope = llama3_rope_factors(shape["dim"] // shape["heads"], 500000.0, *shape["llama3_rope"]) if shape["llama3_rope"] else None
    header = gguf_header(metadata(name, shape, tokenizer), [(n, sh, t, nbytes(sh, t)) for n, sh, t in specs])
    with open(out, "wb") as w:
        w.write(header)
        for n, sh, t in specs:
            size = nbytes(sh, t)
            if n == "rope_freqs.weight":
                w.write(rope.tobytes())
            elif n.endswith("ffn_gate_inp.weight"):  # a router of its own per layer: tokens spread over the experts
                w.write(rng.normal(0.0, 0.02, sh).astype("<f4").tobytes())
            elif ascii_output and n == ("token_embd.weight" if shape["tied"] else "output.weight"):
                pat = patterns.setdefault(t, gguf_twin.pattern(t, rng))
                rows = np.frombuffer((pat * (size // len(pat) + 1))[:size], np.uint8).reshape(sh[0], -1).copy()
                keep, tokens = np.zeros(sh[0], bool), tokenizer["tokenizer.ggml.tokens"][:sh[0]]
                keep[:len(tokens)] = ascii_rows(tokens)
                rows[~keep] = 0  # a block of zero bytes: scale 0, every value 0
                w.write(rows.tobytes())
            else:
                pat = patterns.setdefault(t, gguf_twin.pattern(t, rng))
                chunk = pat * max(1, CHUNK // len(pat))
                for start in range(0, size, len(chunk)):
                    w.write(chunk[:min(len(chunk), size - start)])
            w.write(b"\0" * (-size % ALIGNMENT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", choices=("F16", "BF16", "Q8_0", "Q4_1", *gguf_twin.TWIN_SCALE_STD, *MIXES), required=True,
                    help="every matrix's type, or a llama-quantize mix")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* metadata the twin takes")
    ap.add_argument("--tokenizer-vocab", action="store_true",
                    help="embedding rows = the tokenizer's vocabulary (what llama.cpp requires), not the model's")
    ap.add_argument("--layers", type=int, help="fewer layers than the model's (each layer as the model's)")
    ap.add_argument("--ascii-output", action="store_true",
                    help="zero the output head's rows of tokens with non-ASCII bytes (see make_shape_twin)")
    ap.add_argument("out")
    args = ap.parse_args()
    make_shape_twin(SHAPES[args.shape], args.shape, args.type, args.tokenizer_from, args.out,
                    tokenizer_vocab=args.tokenizer_vocab, layers=args.layers, ascii_output=args.ascii_output)


if __name__ == "__main__":
    main()
