"""Weight packs (--load-format, workers/weight_pack.py): the first load writes every weight's device parts into a
pack, later loads map it; the mapped weights are the directly loaded ones bit for bit, in every stored type, their
buffers are the mapped file's pages (no copy), and a model runs on them as on the direct ones. A changed model file,
layout, shard or code gets a pack of its own; a damaged pack, or one of other shapes, is written again; a disk without
room or an unusable cache directory gets none (the weights load directly); the least recently used packs and crashed
writers' leftovers go first; and a served engine with --load-format packed answers as one with direct."""
import gc
import mmap
import os
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers.gguf_writer import Blocks, write_gguf
from tests.workers.test_architectures import CONTEXT, model_prompt_logprobs
from tests.workers.test_stored_quant_types import COMPACT, SCALE_STD, random_blocks
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers import weight_pack
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.weight_pack import WeightPack, uses_pack
from tinyvllm.workers.weights import load_weights

VOCAB, DIM, FFN = 256, 256, 512
MATRICES = {"attn_q": (DIM, DIM), "attn_k": (DIM // 2, DIM), "attn_v": (DIM // 2, DIM), "attn_output": (DIM, DIM),
            "ffn_gate": (FFN, DIM), "ffn_up": (FFN, DIM), "ffn_down": (DIM, FFN)}
TYPES = [*COMPACT, "Q4_1", "Q8_0", "F16", "F32"]  # every stored type the device keeps, and the float ones


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """A tied 4-layer llama GGUF whose matrices take every type in turn (the embedding Q4_K)."""
    from transformers import LlamaConfig
    from tests.helpers.hf_to_gguf import gguf_metadata
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=FFN, max_position_embeddings=CONTEXT,
                         rms_norm_eps=1e-5, tie_word_embeddings=True)
    rng = np.random.default_rng(0)

    def tensor(type_name, shape, seed):
        if type_name in ("F16", "F32"):
            return (rng.standard_normal(shape) * 0.05).astype(np.float32), type_name
        return Blocks(random_blocks(type_name, *shape, seed=seed, extremes=False,
                                    scale_std=SCALE_STD.get(type_name, 1e-3)), type_name), type_name

    tensors = {"token_embd.weight": tensor("Q4_K", (VOCAB, DIM), 0), "output_norm.weight": (np.ones(DIM), "F32")}
    for i in range(4):
        for j, (name, shape) in enumerate(MATRICES.items()):
            tensors[f"blk.{i}.{name}.weight"] = tensor(TYPES[(7 * i + j) % len(TYPES)], shape, 10 * i + j + 1)
        for norm in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{i}.{norm}.weight"] = (np.ones(DIM), "F32")
    return write_gguf(tmp_path_factory.mktemp("pack") / "m.gguf", gguf_metadata(config, "llama"), tensors)


def build(path, kernels="c", pack=None) -> Transformer:
    cfg, weights = load_weights(path)
    return Transformer(cfg, weights, CONTEXT, kernels=kernels, weight_pack=pack)


def parts(model: Transformer) -> dict[str, list]:
    weights = [("embedding", model.tok_embeddings)] + [
        (f"{i}.{name}" + (f".{j}" if isinstance(value, tuple) else ""), w) for i, layer in enumerate(model.layers)
        for name, value in vars(layer).items()
        for j, w in enumerate(value if isinstance(value, tuple) else (value,)) if hasattr(w, "parts")]
    return {name: (w.kind, [p for p in w.parts]) for name, w in weights}


def exporter(array: np.ndarray):
    """The object whose memory `array` views (through views and memoryviews)."""
    while isinstance(array, np.ndarray):
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_mapped_weights_are_the_direct_ones_in_the_files_pages_and_run_alike(model_path, tmp_path):
    direct = build(model_path)
    kinds = {kind for kind, _ in parts(direct).values()}
    assert kinds >= {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_1", "Q8_0", "Q8_16", "F16", "F32"}, kinds
    written = build(model_path, pack=WeightPack(tmp_path, model_path))
    (pack_file,) = tmp_path.glob("*.pack")
    os.utime(pack_file, ns=(0, 0))
    inode = pack_file.stat().st_ino
    mapped = build(model_path, pack=WeightPack(tmp_path, model_path))
    assert list(tmp_path.glob("*.pack")) == [pack_file] and pack_file.stat().st_ino == inode  # not written again
    assert pack_file.stat().st_mtime_ns > 0  # its use noted: the eviction's clock

    for model in (written, mapped):
        for name, (kind, tensors) in parts(model).items():
            want_kind, want = parts(direct)[name]
            assert kind == want_kind, name
            for got, expected in zip(tensors, want, strict=True):
                assert got.dtype == expected.dtype and got.shape == expected.shape, name
                np.testing.assert_array_equal(got.numpy(), expected.numpy(), err_msg=name)
    for name, (_, tensors) in parts(mapped).items():  # no copy: every part's buffer is the mapped file's pages
        for t in tensors:
            pages = t.uop.buffer.pack_pages
            assert t.uop.buffer._buf.va_addr == pages.ctypes.data and isinstance(exporter(pages), mmap.mmap), name
    assert mapped.weight_nbytes == direct.weight_nbytes
    kept = parts(mapped)["3.w_down"][1][0]
    expected = kept.numpy()
    del mapped, written
    gc.collect()
    np.testing.assert_array_equal(kept.numpy(), expected)  # a weight outliving its model keeps its pages mapped

    prompt = np.random.default_rng(1).integers(0, VOCAB, 24).tolist()
    for kernels in ("c", "tinygrad"):
        pack = WeightPack(tmp_path, model_path)
        mapped_logprobs, mapped_token = model_prompt_logprobs(build(model_path, kernels, pack), prompt)
        direct_logprobs, direct_token = model_prompt_logprobs(build(model_path, kernels), prompt)
        np.testing.assert_array_equal(mapped_logprobs, direct_logprobs)
        assert mapped_token == direct_token


def test_a_changed_file_layout_or_shard_gets_its_own_pack(model_path, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(model_path.read_bytes())
    pack = WeightPack(tmp_path / "packs", copy)
    layout = {"dtype": "auto", "words": False, "c_matmul": True}
    paths = {pack.path(layout), pack.path({**layout, "words": True}), pack.path({**layout, "dtype": "float32"}),
             WeightPack(tmp_path / "packs", copy, (0, 2, 0, 1)).path(layout),
             WeightPack(tmp_path / "packs", model_path).path(layout)}
    assert len(paths) == 5
    os.utime(copy, ns=(0, 12345))  # rewritten in place: another modification time
    assert WeightPack(tmp_path / "packs", copy).path(layout) not in paths


def test_a_change_to_the_repacking_code_gets_its_own_pack(model_path, tmp_path, monkeypatch):
    """The key covers workers/ and protocol/ sources (a source checkout keeps them beside tinyvllm/__init__.py, not
    under it: a key over that folder's sources covered none, and a changed layout mapped a stale pack)."""
    names = {p.name for p in weight_pack.code_files()}
    assert {"quantized_weight.py", "gguf_file.py", "weight_pack.py", "model_config.py"} <= names
    layout = {"dtype": "auto", "words": False, "c_matmul": True}
    before = WeightPack(tmp_path / "packs", model_path).path(layout)
    changed = tmp_path / "src" / "workers" / "quantized_weight.py"
    changed.parent.mkdir(parents=True)
    changed.write_text("# another repacking\n")
    monkeypatch.setattr(weight_pack, "_PACKAGE", tmp_path / "src")
    assert WeightPack(tmp_path / "packs", model_path).path(layout) != before


def test_a_damaged_pack_is_written_again(model_path, tmp_path, caplog):
    build(model_path, pack=WeightPack(tmp_path, model_path))
    (pack_file,) = tmp_path.glob("*.pack")
    size = pack_file.stat().st_size
    with open(pack_file, "r+b") as f:
        f.truncate(size - 100)  # the trailer gone
    direct = parts(build(model_path))
    again = parts(build(model_path, pack=WeightPack(tmp_path, model_path)))
    assert "unusable" in caplog.text and pack_file.stat().st_size == size
    for name, (_, tensors) in again.items():
        for got, expected in zip(tensors, direct[name][1]):
            np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_without_room_on_the_disk_no_pack_is_written_and_the_weights_load_directly(model_path, tmp_path, monkeypatch,
                                                                                 caplog):
    monkeypatch.setattr(weight_pack.shutil, "disk_usage", lambda _: SimpleNamespace(free=1000))
    model = build(model_path, pack=WeightPack(tmp_path, model_path))
    assert not list(tmp_path.glob("*.pack")) and not list(tmp_path.glob("*.tmp*")) and "not written" in caplog.text
    assert model.weight_nbytes == build(model_path).weight_nbytes


def test_the_least_recently_used_packs_go_first(tmp_path):
    for i, size in enumerate((300, 200, 100)):
        (tmp_path / f"{i}.pack").write_bytes(b"x" * size)
        os.utime(tmp_path / f"{i}.pack", ns=(0, [3, 1, 2][i] * 10**9))  # 1 used last, then 2, then 0
    weight_pack._evict(tmp_path, 350)
    assert sorted(p.name for p in tmp_path.glob("*.pack")) == ["0.pack"]  # 1 (oldest use) and 2 went
    weight_pack._evict(tmp_path, 300)
    assert [p.name for p in tmp_path.glob("*.pack")] == ["0.pack"]


def test_auto_packs_weight_files_of_a_gigabyte_or_more(tmp_path):
    big, small = tmp_path / "big.gguf", tmp_path / "small.gguf"
    with open(big, "wb") as f:
        f.truncate(weight_pack.AUTO_MIN_BYTES)  # sparse: no disk used
    small.write_bytes(b"x")
    assert uses_pack("auto", big) and not uses_pack("auto", small)
    assert uses_pack("packed", small) and not uses_pack("direct", big)


def test_an_engine_loading_a_pack_answers_as_one_loading_directly(tmp_path):
    from tinyvllm.frontend.engine.llm import LLM
    from tests.helpers.tiny_model import make_tiny_gguf
    path = make_tiny_gguf(tmp_path / "tiny.gguf")
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before, answers, new_packs = set(weight_pack.pack_directory().glob("*.pack")), [], []
    for load_format in ("direct", "packed", "packed"):  # the second "packed" maps what the first wrote
        with LLM(str(path), max_num_seqs=2, max_model_len=64, num_kv_blocks=16, load_format=load_format) as llm:
            answers.append([out.token_ids for out in llm.generate(prompts, greedy)])
        new_packs.append(sorted(p.stat().st_ino for p in set(weight_pack.pack_directory().glob("*.pack")) - before))
    assert answers[1] == answers[2] == answers[0]
    assert new_packs[0] == [] and len(new_packs[1]) == 1 and new_packs[2] == new_packs[1]  # written once, then mapped


def test_a_pack_of_other_shapes_is_not_used(model_path, tmp_path, caplog):
    """A pack whose weights have the same names but other shapes (it cannot be this model's) is written again."""
    from tests.helpers.tiny_model import make_tiny_gguf
    small, large = (make_tiny_gguf(tmp_path / f"{dim}.gguf", dim=dim) for dim in (64, 128))
    build(small, pack=WeightPack(tmp_path / "packs", small))
    (small_pack,) = (tmp_path / "packs").glob("*.pack")
    layout = {"dtype": "auto", "words": False, "c_matmul": True}
    small_pack.rename(WeightPack(tmp_path / "packs", large).path(layout))
    model = build(large, pack=WeightPack(tmp_path / "packs", large))
    assert "unusable" in caplog.text and model.layers[0].gate_up[0].shape == (128, 128)
    assert model.weight_nbytes == build(large).weight_nbytes


def test_an_unusable_cache_directory_loads_the_weights_directly(model_path, tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    model = build(model_path, pack=WeightPack(tmp_path / "file" / "packs", model_path))
    assert "not used" in caplog.text and model.weight_nbytes == build(model_path).weight_nbytes


def test_a_crashed_writers_leftover_goes_a_running_ones_stays(tmp_path):
    (tmp_path / "a.tmp999999999").write_bytes(b"x")  # no such process
    (tmp_path / f"b.tmp{os.getpid()}").write_bytes(b"x")
    weight_pack._evict(tmp_path, 1 << 30)
    assert [p.name for p in tmp_path.iterdir()] == [f"b.tmp{os.getpid()}"]


def test_new_code_gets_a_new_pack(model_path, tmp_path, monkeypatch):
    layout = {"dtype": "auto", "words": False, "c_matmul": True}
    before = WeightPack(tmp_path, model_path).path(layout)
    monkeypatch.setattr(weight_pack, "_code_digest", lambda: "a fixed repack")
    assert WeightPack(tmp_path, model_path).path(layout) != before
