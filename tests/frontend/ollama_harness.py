"""The app with Ollama's routes around the fake engine and tokenizer, small GGUF files to serve, NDJSON parsing."""
import json
import pathlib

import httpx
import numpy as np

from app_harness import MODEL, REPLY
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from tinyvllm.frontend.api.app import build_app
from tests.helpers.gguf_writer import write_gguf

SERVED = MODEL + ":latest"
MAX_MODEL_LEN = 256  # one token per character: room for templates and format instructions


def write_small_gguf(path: pathlib.Path, seed: int = 0, dim: int = 32, vocab: int = 64) -> pathlib.Path:
    """A llama GGUF with metadata enough for ModelConfig and a few tensors (never run, only described)."""
    rng = np.random.default_rng(seed)
    md = {"general.architecture": "llama", "general.file_type": 1, "llama.vocab_size": vocab,
          "llama.context_length": 128, "llama.embedding_length": dim, "llama.block_count": 1,
          "llama.feed_forward_length": 64, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)]}
    tensors = {"token_embd.weight": (rng.standard_normal((vocab, dim)).astype(np.float32), "F16"),
               "output_norm.weight": (np.ones(dim, np.float32), "F32")}
    return write_gguf(path, md, tensors)


def build_ollama_app(tmp_path: pathlib.Path | None, reply: str = REPLY, model_root: str | None = None,
                     **engine_kwargs):
    """(app, engine, tokenizer); models live in tmp_path/models (tmp_path None: no models folder)."""
    tokenizer = CharTokenizer()
    engine = FakeEngine(tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=MAX_MODEL_LEN, **engine_kwargs)
    models_dir = str(tmp_path / "models") if tmp_path is not None else None
    app = build_app(engine, tokenizer, MODEL, MAX_MODEL_LEN, model_root=model_root, max_body_bytes=64 * 1024,
                    make_detokenizer=CharDetokenizer, models_dir=models_dir)
    return app, engine, tokenizer


def make_ollama_app(tmp_path: pathlib.Path | None, reply: str = REPLY, model_root: str | None = None,
                    **engine_kwargs):
    """(httpx client, engine, tokenizer) for build_ollama_app's app."""
    app, engine, tokenizer = build_ollama_app(tmp_path, reply, model_root, **engine_kwargs)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test", timeout=10)
    return client, engine, tokenizer


def parse_ndjson(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson"), response.headers
    assert response.text.endswith("\n")
    return [json.loads(line) for line in response.text.splitlines()]


def only_request(engine: FakeEngine):
    """The one AddRequest the fake engine saw."""
    assert len(engine.requests) == 1, list(engine.requests)
    return next(iter(engine.requests.values()))
