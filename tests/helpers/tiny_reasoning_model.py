"""A tiny random Qwen3 that thinks, as a Hugging Face folder: the default model's tokenizer with Qwen3's `<think>`
and `</think>` added as plain (not special) tokens, as Qwen3's own tokenizer has them, and a chat template in the
shape of Qwen3's thinking models: the generation prompt opens a think block, and `enable_thinking: false` closes it
empty at once. Its replies are random tokens, so a test sees the thinking end only where the server ends it (a
thinking budget) or in the template (enable_thinking false)."""
from __future__ import annotations

import json
import pathlib

from tests.helpers.tiny_model import VOCAB_SIZE, tokenizer_metadata

THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


def make_thinking_qwen3(folder: str | pathlib.Path) -> pathlib.Path:
    import torch
    from tokenizers import AddedToken
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from tinyvllm.protocol.tokenizer import _tokenizer_from_gguf_metadata
    folder = pathlib.Path(folder)
    tokenizer = _tokenizer_from_gguf_metadata(tokenizer_metadata())
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    assert tokenizer.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE + 2
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB_SIZE + 2, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True)).float().eval()
    with torch.no_grad():  # weights that make greedy decoding wander, as tests/helpers/tiny_model.py's do
        model.model.embed_tokens.weight.normal_(0.0, 0.5)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                module.weight.normal_(0.0, module.in_features ** -0.5)
        model.model.norm.weight.normal_()  # random signs: the token just read is no longer the likeliest next
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": THINKING_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}))
    return folder
