"""A tiny random Llama as a Hugging Face folder with the default model's tokenizer, and LoRA adapters over it made
by peft (random A and B, not peft's zero B, so each changes the outputs): what the engine and server tests of LoRA
serve, with transformers + peft as the reference."""
from __future__ import annotations

import copy
import pathlib

import numpy as np

from tests.helpers.tiny_model import VOCAB_SIZE, tokenizer_metadata

ADAPTERS = {"small": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
            "wide": dict(r=16, lora_alpha=8, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                         use_rslora=True)}


def tiny_llama(vocab_size: int = VOCAB_SIZE, context: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                        max_position_embeddings=context, rope_theta=10000.0, rms_norm_eps=1e-6))


def with_adapter(base, folder: pathlib.Path, seed: int, **options):
    """A peft copy of `base` with a random adapter of `options` (peft's LoraConfig), saved in `folder`."""
    import torch
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    tuned = get_peft_model(copy.deepcopy(base), LoraConfig(init_lora_weights=False, **options)).eval()
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, 0.3)
    tuned.save_pretrained(folder)
    return tuned


def make_llama_with_adapters(folder: pathlib.Path, vocab_size: int = VOCAB_SIZE, tokenizer: bool = True):
    """(the base model's folder, {adapter name: (its folder, its peft model)}, the base transformers model)"""
    import torch
    from tinyvllm.protocol.tokenizer import _tokenizer_from_gguf_metadata
    torch.manual_seed(0)
    base = tiny_llama(vocab_size).float().eval()
    with torch.no_grad():  # weights that make greedy decoding wander, as tests/helpers/tiny_model.py's do
        base.model.embed_tokens.weight.normal_(0.0, 0.5)
        base.model.norm.weight.normal_()
    base.save_pretrained(folder / "base")
    if tokenizer:
        _tokenizer_from_gguf_metadata(tokenizer_metadata()).save(str(folder / "base" / "tokenizer.json"))
    else:
        (folder / "base" / "tokenizer.json").touch()  # a model folder has one; the weights do not need it
    adapters = {name: (folder / name, with_adapter(base, folder / name, 10 + i, **options))
                for i, (name, options) in enumerate(ADAPTERS.items())}
    return folder / "base", adapters, base


def greedy_reference(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `prompt` (n tokens) and each token's logprob, float32 as served."""
    import torch
    ids, tokens, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy()
            token = int(np.argmax(logits))
            tokens.append(token)
            logprobs.append(float(logits[token]))
            ids.append(token)
    return tokens, logprobs


def write_lora_gguf(peft_folder, path, cfg, alpha: float):
    """The adapter as llama.cpp's convert_lora_to_gguf.py writes it (with the gguf package, the format's reference):
    blk.{i}.{tensor}.weight.lora_a / .lora_b, llama's q and k rows of B in llama.cpp's interleaved order."""
    import gguf
    from safetensors.numpy import load_file
    from tests.helpers.hf_to_gguf import llama_cpp_permute
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for key, value in sorted(load_file(peft_folder / "adapter_model.safetensors").items()):
        parts = key.split(".")
        layer, module, kind = parts[parts.index("layers") + 1], parts[parts.index("layers") + 3], key[-8]
        if kind == "B" and module in ("q_proj", "k_proj"):
            value = llama_cpp_permute(value, cfg.n_heads if module == "q_proj" else cfg.n_kv_heads)
        writer.add_tensor(f"blk.{layer}.{names[module]}.weight.lora_{kind.lower()}", value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
