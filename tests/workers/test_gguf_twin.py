"""benchmarks/gguf_twin.py: a twin loads like its source (same header, names, shapes, types) with finite weights."""
import importlib.util
import pathlib

import numpy as np

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGUFFile
from tinyvllm.workers.gguf_dequantize import dequantize, dequantize_tensor

_spec = importlib.util.spec_from_file_location("gguf_twin", pathlib.Path(__file__).parents[2] / "benchmarks" / "gguf_twin.py")
gguf_twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gguf_twin)


def test_twin_keeps_the_header_and_replaces_the_weights(tmp_path):
    src = make_tiny_gguf(tmp_path / "tiny.gguf", dim=64, ffn=128)
    gguf_twin.make_twin(str(src), str(tmp_path / "twin.gguf.xz"))
    assert (tmp_path / "twin.gguf.xz").stat().st_size < src.stat().st_size / 2
    gguf_twin.unpack(str(tmp_path / "twin.gguf.xz"), str(tmp_path / "twin.gguf"))
    a, b = GGUFFile(src), GGUFFile(tmp_path / "twin.gguf")
    assert a.metadata == b.metadata and a.tensor_names == b.tensor_names
    assert {"F16", "Q8_0", "F32"} <= {a.tensor_type(n) for n in a.tensor_names}
    for name in a.tensor_names:
        assert a.tensor_info(name) == b.tensor_info(name)
        w = dequantize_tensor(b, name)
        assert np.isfinite(w).all() and np.abs(w).max() < 2
        if w.size > 4096:  # a pattern, not the source's values
            assert not np.array_equal(w, dequantize_tensor(a, name))


def test_q4_1_pattern_is_valid_blocks_of_small_values():
    raw = np.frombuffer(gguf_twin.pattern("Q4_1", np.random.default_rng(0)), np.uint8)
    w = dequantize(raw, GGML_TYPE_IDS["Q4_1"], gguf_twin.PATTERN_BLOCKS * 32)
    assert np.isfinite(w).all() and 0.005 < np.abs(w).max() < 0.1
