"""Independent reference: Hugging Face transformers (torch, float32, CPU) running the default GGUF model.

transformers dequantises the GGUF itself (its own code, not ours). Because that takes ~25 s on a small
machine, the first call saves the converted model as an ordinary HF folder (float32 safetensors,
config, tokenizer) under the cache dir, and greedy results are memoised in a JSON file; both are
keyed by the GGUF's size/mtime and the transformers version.

    reference_greedy([[1, 2, 3], ...], n_tokens=32) ->
        [{"token_ids": [...], "top2_gap": [...]}, ...]   # gap = top1 - top2 logit at each step

A comparison should stop at the first step whose top2_gap is tiny (< 1e-3): there the argmax is
decided by rounding noise and either token is right.

Cache dir: $TINYVLLM_TEST_CACHE, else <repo>/.cache (git-ignored).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_model = None  # the loaded torch model, shared by every caller in this process


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TINYVLLM_TEST_CACHE", REPO_ROOT / ".cache")) / "hf_reference"


def _gguf_path() -> pathlib.Path:
    from tinyvllm.protocol.model_path import resolve_model_path
    return resolve_model_path(None)


def _cache_key() -> str:
    from importlib.metadata import version  # not `import transformers`: that alone takes seconds
    st = _gguf_path().stat()
    ident = f"{_gguf_path()}|{st.st_size}|{st.st_mtime_ns}|{version('transformers')}|{version('torch')}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def reference_hf_folder() -> pathlib.Path:
    """A HF model folder (config.json, model.safetensors, tokenizer files) made by transformers from the GGUF."""
    folder = cache_dir() / _cache_key()
    if (folder / "done").exists():
        return folder
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=folder.parent))  # built aside, then renamed: safe under concurrency
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shares storage with the embedding; safetensors refuses duplicates
    safetensors.torch.save_file(state, str(tmp / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(tmp)
    (tmp / "done").write_text("")
    try:
        tmp.rename(folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _load_model():
    global _model
    if _model is None:
        import torch
        from transformers import AutoModelForCausalLM

        _model = AutoModelForCausalLM.from_pretrained(reference_hf_folder(), dtype=torch.float32).eval()
    return _model


def _greedy_batch(model, prompts: list[list[int]], n_tokens: int) -> list[dict]:
    """All prompts in one left-padded batch: decoding is memory-bound, so this is ~batch-size times faster."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    results = [{"token_ids": [], "top2_gap": []} for _ in prompts]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a small, busy CI box, torch's thread pool oversubscribes and runs 3-5x slower
    try:
        _decode_loop(model, ids, mask, positions, n_tokens, results)
    finally:
        torch.set_num_threads(threads)
    return results


def _decode_loop(model, ids, mask, positions, n_tokens: int, results: list[dict]) -> None:
    import torch

    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for step in range(n_tokens):
            top = torch.topk(out.logits[:, -1].float(), 2, dim=-1)
            gaps = (top.values[:, 0] - top.values[:, 1]).tolist()
            for r, token, gap in zip(results, top.indices[:, 0].tolist(), gaps):
                r["token_ids"].append(token)
                r["top2_gap"].append(gap)
            if step == n_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(len(results), 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=top.indices[:, :1], attention_mask=mask, position_ids=positions,
                        past_key_values=out.past_key_values, use_cache=True)


def reference_greedy(prompts_token_ids: list[list[int]], n_tokens: int = 32) -> list[dict]:
    """Greedy continuation (no EOS stop) of each prompt, with the top-1/top-2 logit gap per step."""
    memo_file = cache_dir() / f"greedy-{_cache_key()}.json"
    memo = json.loads(memo_file.read_text()) if memo_file.exists() else {}
    keys = [f"{n_tokens}:{','.join(map(str, p))}" for p in prompts_token_ids]
    todo = {k: list(p) for k, p in zip(keys, prompts_token_ids) if k not in memo}
    if todo:
        memo.update(zip(todo, _greedy_batch(_load_model(), list(todo.values()), n_tokens)))
        # write-then-rename so that concurrent test processes never read a half-written file
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=memo_file.parent, delete=False, suffix=".tmp") as f:
            json.dump(memo, f)
        os.replace(f.name, memo_file)
    return [memo[k] for k in keys]
