"""GGUFFile against an independent dequantiser (tinygrad.llm.gguf) on the real model and on synthetic files."""
import os
import time

import numpy as np
import pytest

os.environ.setdefault("DEV", "CPU")

from tests.helpers.gguf_writer import GGML_TYPE_IDS, random_blocks, write_gguf  # noqa: E402
from tinyvllm.protocol.gguf_file import GGML_TYPES, GGUFFile  # noqa: E402
from tinyvllm.workers.gguf_dequantize import dequantize, dequantize_tensor  # noqa: E402


def tinygrad_dequant(raw: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
    from tinygrad import Tensor
    from tinygrad.llm.gguf import ggml_data_to_tensor
    return ggml_data_to_tensor(Tensor(np.ascontiguousarray(raw)), n, ggml_type).numpy().reshape(-1)


@pytest.fixture(scope="module")
def smollm(default_model_path):
    return GGUFFile(default_model_path)


def test_header_metadata_and_shapes(smollm):
    md = smollm.metadata
    assert smollm.version == 3 and smollm.alignment == 32
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 30
    assert md["tokenizer.ggml.pre"] == "smollm" and md["tokenizer.ggml.add_bos_token"] is False
    assert len(md["tokenizer.ggml.tokens"]) == 49152 and md["tokenizer.ggml.tokens"][2] == "<|im_end|>"
    assert md["tokenizer.ggml.token_type"][:17] == [3] * 17 and len(md["tokenizer.ggml.merges"]) == 48900
    assert md["llama.rope.freq_base"] == 100000.0
    assert len(smollm.tensor_names) == 272 and "output.weight" not in smollm.tensor_names
    assert smollm.tensor_shape("blk.0.attn_q.weight") == (576, 576)
    assert smollm.tensor_shape("blk.0.attn_k.weight") == (192, 576)
    assert smollm.tensor_shape("blk.0.ffn_down.weight") == (576, 1536)
    assert smollm.tensor_shape("token_embd.weight") == (49152, 576)
    assert smollm.tensor_shape("output_norm.weight") == (576,)
    assert {smollm.tensor_type(n) for n in smollm.tensor_names} == {"F32", "Q4_1", "Q8_0"}


def test_every_tensor_type_and_shape_matches_tinygrad(smollm):
    seen = set()
    for name in smollm.tensor_names:
        info = smollm.tensor_info(name)
        if (info.ggml_type, info.shape) in seen:
            continue
        seen.add((info.ggml_type, info.shape))
        mine = dequantize_tensor(smollm, name)
        ref = tinygrad_dequant(smollm.raw(name), info.ggml_type, mine.size).reshape(info.shape)
        assert mine.dtype == np.float32 and mine.shape == info.shape
        np.testing.assert_array_equal(mine, ref, err_msg=name)
    assert {t for t, _ in seen} == {0, 3, 8}


def test_whole_model_loads_fast(smollm):
    start = time.perf_counter()
    total = sum(dequantize_tensor(smollm, n).size for n in smollm.tensor_names)
    assert total > 130e6
    assert time.perf_counter() - start < 6  # ~1 s on 2 cores; generous for busy CI machines


def test_synthetic_tensors_roundtrip_against_tinygrad(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64)).astype(np.float32) * 3
    x[0] = 0  # an all-zero block: scale 0
    x[1, :32] = 5.0  # a constant block
    x[2, :32] = np.linspace(-1, 1, 32)
    tensors = {f"t.{name}": (x, name) for name in ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")}
    tensors["vec"] = (np.arange(7, dtype=np.float32), "F32")  # odd size: exercises data padding
    gguf = GGUFFile(write_gguf(tmp_path / "t.gguf", {"general.architecture": "test"}, tensors))
    assert gguf.tensor_names == list(tensors)
    np.testing.assert_array_equal(dequantize_tensor(gguf, "vec"), np.arange(7))
    bounds = {"F32": 0, "F16": 5e-3, "Q8_0": 0.05, "Q4_0": 1.2, "Q4_1": 0.6}  # max error vs the original
    for name, bound in bounds.items():
        t = f"t.{name}"
        mine = dequantize_tensor(gguf, t)
        assert gguf.tensor_type(t) == name and mine.shape == (8, 64)
        np.testing.assert_array_equal(mine.reshape(-1), tinygrad_dequant(gguf.raw(t), GGML_TYPE_IDS[name], x.size))
        assert np.abs(mine - x).max() <= bound, name
        np.testing.assert_array_equal(mine[0], 0)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_quant_formats_on_random_blocks_match_tinygrad(type_name):
    ggml_type = {name: t for t, (name, _, _) in GGML_TYPES.items()}[type_name]
    raw = random_blocks(type_name, (64,), np.random.default_rng(ggml_type), scale_std=1.0).reshape(-1)
    n = 64 * GGML_TYPES[ggml_type][1]
    np.testing.assert_allclose(dequantize(raw, ggml_type, n), tinygrad_dequant(raw, ggml_type, n), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ggml_type", [1, 30])  # F16, BF16
def test_half_precision_formats_match_tinygrad(ggml_type):
    raw = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    raw = raw.astype("<f2").view(np.uint8) if ggml_type == 1 else (raw.view("<u4") >> 16).astype("<u2").view(np.uint8)
    np.testing.assert_array_equal(dequantize(raw, ggml_type, 256), tinygrad_dequant(raw, ggml_type, 256))


def test_unsupported_type_names_the_type():
    with pytest.raises(ValueError, match="IQ3_XXS"):
        dequantize(np.zeros(98, np.uint8), 18, 256)


def test_all_metadata_value_types_roundtrip(tmp_path):
    md = {
        "u8": np.uint8(200), "i8": np.int8(-5), "u16": np.uint16(60000), "i16": np.int16(-300),
        "u32": 4_000_000_000, "i32": np.int32(-7), "f32": 0.5, "bool": True, "str": "héllo ✓",
        "u64": np.uint64(2**63), "i64": -2**40, "f64": np.float64(1e-300),
        "arr.str": ["a", "", "日本"], "arr.int": [1, 2, 3], "arr.neg": [-1, 2], "arr.f": [0.25, -1.5],
        "arr.bool": [True, False], "arr.nested": [[1, 2], [3]], "arr.empty": [],
    }
    gguf = GGUFFile(write_gguf(tmp_path / "md.gguf", md, {}))
    assert gguf.metadata == {k: (v.item() if isinstance(v, np.generic) else v) for k, v in md.items()}
    assert gguf.tensor_names == []


def test_rejects_bad_files(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="magic"):
        GGUFFile(tmp_path / "bad.gguf")
    path = write_gguf(tmp_path / "t.gguf", {}, {"w": (np.ones((4, 32), np.float32), "Q8_0")})
    full = path.read_bytes()
    for cut in (full[:-40], full[:30]):  # missing tensor data; missing part of the header
        path.write_bytes(cut)
        with pytest.raises(ValueError, match="truncated"):
            GGUFFile(path)


def test_a_header_rewritten_in_place_is_read_again_and_callers_get_their_own_lists(tmp_path):
    """The per-process header cache (one parse for the config, fingerprint and tokenizer) keys on the file's
    identity and checks the header's bytes: a same-size rewrite within one timestamp tick is seen."""
    path = tmp_path / "m.gguf"
    tensors = {"t": (np.zeros((2, 32), np.float32), "F32")}
    write_gguf(path, {"general.architecture": "test", "x": 1, "names": ["a", "b"]}, tensors)
    first = GGUFFile(path)
    stat = os.stat(path)
    first.metadata["names"].append("c")
    assert GGUFFile(path).metadata["names"] == ["a", "b"]
    write_gguf(path, {"general.architecture": "test", "x": 2, "names": ["a", "b"]}, tensors)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_ino == stat.st_ino
    assert GGUFFile(path).metadata["x"] == 2


def test_forgotten_headers_are_parsed_again_on_the_next_open(tmp_path):
    """A worker or frontend frees its parsed vocabulary once done with it (forget_parsed_headers); the file still
    opens, with the same metadata."""
    import tinyvllm.protocol.gguf_file as gguf_file
    path = tmp_path / "m.gguf"
    write_gguf(path, {"general.architecture": "test", "tokenizer.ggml.tokens": [f"t{i}" for i in range(1000)]},
               {"t": (np.zeros((2, 32), np.float32), "F32")})
    vocab = GGUFFile(path).metadata["tokenizer.ggml.tokens"]
    assert any(path.name in key[0] for key in gguf_file._HEADERS)
    gguf_file.forget_parsed_headers()
    assert not gguf_file._HEADERS
    assert GGUFFile(path).metadata["tokenizer.ggml.tokens"] == vocab
