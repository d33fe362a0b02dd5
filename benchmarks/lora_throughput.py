"""LoRA adapters' cost: output tok/s of 16 concurrent greedy requests on the default model without --enable-lora,
and with it (4 slots of rank 16) for batches of the base model only, of one adapter, and of four adapters mixed
(random PEFT adapters of rank 16 on every product: the most work an adapter adds).

    .venv/bin/python benchmarks/lora_throughput.py [--requests 16] [--tokens 64] [--repeats 3] [--kernels c-int8]

Prints a markdown table of medians.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinyvllm import LLM, LoRARequest, SamplingParams  # noqa: E402
from tinyvllm.protocol.model_config import read_model_config  # noqa: E402
from tinyvllm.protocol.model_path import resolve_model_path  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapters(folder: str, count: int) -> list[str]:
    """`count` random rank-16 PEFT adapters over a model of the default model's shapes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = read_model_config(resolve_model_path(None))
    base = LlamaForCausalLM(LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
                                        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                                        head_dim=cfg.head_dim, intermediate_size=cfg.ffn_dim))
    paths = []
    for i in range(count):
        torch.manual_seed(i)
        tuned = get_peft_model(base, LoraConfig(r=16, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False))
        path = os.path.join(folder, f"adapter{i}")
        tuned.save_pretrained(path)
        base = tuned.unload()
        paths.append(path)
    return paths


def tok_s(llm: LLM, prompts: list[str], sampling: SamplingParams, adapters: list) -> float:
    start = time.perf_counter()
    results = llm.generate(prompts, sampling, lora_request=adapters if any(adapters) else None)
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", default=None)
    args = parser.parse_args()
    prompts = [f"Write a short story about the number {i}." for i in range(args.requests)]
    sampling = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    engine = dict(max_num_seqs=args.requests, **({"kernels": args.kernels} if args.kernels else {}))
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        adapters = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(write_adapters(folder, 4))]
        cases = {"base model, no --enable-lora": (dict(), [None] * args.requests),
                 "--enable-lora, base model rows only": (dict(enable_lora=True, max_loras=4), [None] * args.requests),
                 "--enable-lora, one adapter": (dict(enable_lora=True, max_loras=4), [adapters[0]] * args.requests),
                 "--enable-lora, four adapters mixed": (dict(enable_lora=True, max_loras=4),
                                                        [adapters[i % 4] for i in range(args.requests)])}
        for label, (options, requests) in cases.items():
            with LLM(**engine, **options) as llm:
                tok_s(llm, prompts, sampling, requests)  # captures the buckets, loads the adapters
                rows[label] = statistics.median(tok_s(llm, prompts, sampling, requests) for _ in range(args.repeats))
    base = rows["base model, no --enable-lora"]
    print(f"| {args.requests} requests x {args.tokens} tokens | output tok/s (median of {args.repeats}) | vs no LoRA |")
    print("|---|---|---|")
    for label, value in rows.items():
        print(f"| {label} | {value:.1f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main()
