"""What the scheduler and a worker must agree on before the worker may join: the tinyvllm version, the model (a
fingerprint), the tensor/pipeline sizes and the worker's share of the layers. Block size, context length and the
KV cache are not checked: the scheduler dictates them in InitWorker. No tinygrad here."""
import dataclasses
import hashlib
import importlib.metadata
import json
import pathlib

from tinyvllm.protocol.messages import WorkerHello
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import is_gguf
from tinyvllm.protocol.parallel_layout import ShardSpec

SAMPLE_BYTES = 1 << 20


def tinyvllm_version() -> str:
    return importlib.metadata.version("tinyvllm")


def _weight_files(path: pathlib.Path) -> list[pathlib.Path]:
    return [path] if is_gguf(path) else sorted(path.glob("*.safetensors"))


def model_fingerprint(path: str | pathlib.Path) -> str:
    """A readable summary and a hash of the config, the weight files' sizes and their first and last MiB (so two
    random models of one shape differ, while the file's name and folder do not matter), without reading it all."""
    path = pathlib.Path(path)
    cfg = read_model_config(path)
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    total = 0
    for file in _weight_files(path):
        size = file.stat().st_size
        total += size
        digest.update(size.to_bytes(8, "little"))
        with open(file, "rb") as f:
            digest.update(f.read(SAMPLE_BYTES))
            f.seek(max(0, size - SAMPLE_BYTES))
            digest.update(f.read(SAMPLE_BYTES))
    return (f"{cfg.arch} {cfg.n_layers} layers dim {cfg.dim} vocab {cfg.vocab_size} {total / 1e6:.1f} MB "
            f"#{digest.hexdigest()[:16]}")


@dataclasses.dataclass(frozen=True, slots=True)
class EngineShape:
    """The scheduler's side of the comparison."""
    version: str
    model_fingerprint: str
    tp_size: int
    pp_size: int
    n_layers: int


def compatibility_problem(expected: EngineShape, hello: WorkerHello) -> str | None:
    """Why this worker cannot join this engine, or None when it can."""
    if hello.version != expected.version:
        return f"tinyvllm {hello.version or '(unknown)'} on the worker, {expected.version} here"
    if (hello.tp_size, hello.pp_size) != (expected.tp_size, expected.pp_size):
        return (f"started with --tensor-parallel-size {hello.tp_size} --pipeline-parallel-size {hello.pp_size}, "
                f"this engine runs {expected.tp_size} x {expected.pp_size}")
    if hello.world_size != expected.tp_size * expected.pp_size or not 0 <= hello.rank < hello.world_size:
        return f"rank {hello.rank} of {hello.world_size} workers; this engine has {expected.tp_size * expected.pp_size}"
    if hello.model_fingerprint != expected.model_fingerprint:
        return (f"a different model: the worker loaded [{hello.model_fingerprint}], this engine serves "
                f"[{expected.model_fingerprint}] (is --model the same file on both machines?)")
    layers = ShardSpec.of_rank(hello.rank, hello.tp_size, hello.pp_size).layers(expected.n_layers)
    if hello.layers != [layers.start, layers.stop]:
        return (f"it would hold layers {hello.layers}; this engine gives rank {hello.rank} "
                f"layers [{layers.start}, {layers.stop}]")
    return None
