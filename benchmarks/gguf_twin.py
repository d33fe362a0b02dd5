"""A shape twin of a GGUF model, small enough to carry: what a speed benchmark needs, without the weights.

    python benchmarks/gguf_twin.py SRC.gguf TWIN.gguf.xz       # here: header kept, weights replaced
    python benchmarks/gguf_twin.py --unpack TWIN.gguf.xz TWIN.gguf   # there: the GGUF to serve or profile

The twin keeps SRC's header byte for byte (metadata, tokenizer, tensor names, shapes, types and offsets), so
it loads, tokenizes and costs exactly what SRC does; every tensor's data is replaced by a seeded random
pattern of valid blocks of the same type, repeated, so that xz shrinks it to a few MB (the device machine
takes at most 64 MiB per call; the default model is 98 MB). Its text is gibberish: use it for speed only.
"""
import argparse
import lzma
import os
import pathlib
import shutil
import sys

import numpy as np

from tinyvllm.protocol.gguf_file import GGUFFile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests.helpers: valid random blocks

PATTERN_BLOCKS = 4096  # distinct blocks per tensor type; well inside xz's dictionary, so repeats cost nothing
TWIN_SCALE_STD = {"Q4_0": 0.004, "Q5_0": 0.002, "Q5_1": 0.001, "Q4_K": 4e-5, "Q5_K": 2e-5, "Q6_K": 8e-6,
                  "IQ4_NL": 2e-4, "IQ4_XS": 8e-6, "Q2_K": 1e-3, "Q3_K": 5e-4}


def pattern(type_name: str, rng: np.random.Generator) -> bytes:
    """PATTERN_BLOCKS valid blocks (or elements) of `type_name` with small, finite values."""
    n = PATTERN_BLOCKS
    if type_name == "F32":
        return rng.normal(1.0, 0.1, n).astype("<f4").tobytes()
    if type_name == "F16":
        return rng.normal(0.0, 0.02, n).astype("<f2").tobytes()
    if type_name == "BF16":  # a float32's top half
        return (rng.normal(0.0, 0.02, n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    if type_name == "Q4_1":  # f16 d, f16 m, 16 bytes of nibbles: values q * d + m in about [-0.03, 0.03]
        d = rng.uniform(0.002, 0.006, n).astype("<f2")
        m = (-8 * d.astype(np.float32)).astype("<f2")
        q = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        return np.concatenate([d.view(np.uint8).reshape(n, 2), m.view(np.uint8).reshape(n, 2), q], axis=1).tobytes()
    if type_name == "Q8_0":  # f16 d, 32 int8
        d = rng.uniform(0.0002, 0.0006, n).astype("<f2")
        q = rng.integers(-127, 128, (n, 32), dtype=np.int8)
        return np.concatenate([d.view(np.uint8).reshape(n, 2), q.view(np.uint8)], axis=1).tobytes()
    if type_name in TWIN_SCALE_STD:  # random codes and sub-block scales, float16 scales for values of ~0.02
        from tests.helpers.gguf_writer import random_blocks
        return random_blocks(type_name, (n,), rng, TWIN_SCALE_STD[type_name]).tobytes()
    raise ValueError(f"no twin pattern for {type_name}")


def make_twin(src: str, out: str, seed: int = 0) -> None:
    gguf = GGUFFile(src)
    rng = np.random.default_rng(seed)
    patterns: dict[str, bytes] = {}
    infos = sorted((gguf.tensor_info(n) for n in gguf.tensor_names), key=lambda i: i.offset)
    with open(src, "rb") as f, lzma.open(out, "wb", preset=6) as w:
        pos = infos[0].offset
        w.write(f.read(pos))  # magic, metadata, tensor infos, alignment padding: verbatim
        for info in infos:
            w.write(b"\0" * (info.offset - pos))
            pat = patterns.setdefault(info.type_name, pattern(info.type_name, rng))
            reps = -(-info.nbytes // len(pat))
            w.write((pat * reps)[:info.nbytes])
            pos = info.offset + info.nbytes
        w.write(b"\0" * (os.path.getsize(src) - pos))


def unpack(src: str, out: str) -> None:
    with lzma.open(src, "rb") as r, open(out, "wb") as w:
        shutil.copyfileobj(r, w, 1 << 24)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unpack", action="store_true", help="decompress a twin made here into a .gguf")
    ap.add_argument("src")
    ap.add_argument("out")
    args = ap.parse_args()
    if args.unpack:
        unpack(args.src, args.out)
    else:
        make_twin(args.src, args.out)


if __name__ == "__main__":
    main()
