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
