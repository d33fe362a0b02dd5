"""Single-stream decode speed with n-gram speculative decoding against none, on a task whose output copies its prompt
(editing code: the same functions with a variable renamed), and the acceptance rate.

Each configuration is its own engine; one untimed run of the same request first captures the jits (its prompt then
comes from the prefix cache in the timed runs, alike for both). Greedy, so both produce the same tokens.

    DEV=CPU .venv/bin/python benchmarks/spec_decode.py [--max-tokens 192] [--runs 3] [--k 3]
"""
import argparse
import json
import time

from tinyvllm.frontend.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams

CODE = '''def load_config(path):
    with open(path) as handle:
        config = json.load(handle)
    if "name" not in config:
        raise ValueError("config without a name")
    config["name"] = config["name"].strip()
    return config


def save_config(config, path):
    with open(path, "w") as handle:
        json.dump(config, handle, indent=2)
'''
PROMPT = CODE + "\n\n# The same two functions, with `config` renamed to `settings` everywhere:\n"


def run(speculative: dict | None, max_tokens: int, runs: int, async_scheduling: bool = True) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(max_num_seqs=1, max_model_len=1024, num_kv_blocks=128, speculative_config=speculative,
             async_scheduling=async_scheduling) as llm:
        ids = llm.tokenizer.encode(PROMPT)
        llm.generate([ids], greedy)  # captures the jits
        before = llm.stats
        times, tokens = [], None
        for _ in range(runs):
            start = time.perf_counter()
            out = llm.generate([ids], greedy)[0]
            times.append(time.perf_counter() - start)
            tokens = out.token_ids
        after = llm.stats
    drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    drafts = after.spec_num_drafts - before.spec_num_drafts
    return {"tok_s": len(tokens) / min(times), "prompt_tokens": len(ids), "tokens": tokens,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_per_draft": accepted / drafts if drafts else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    args = parser.parse_args()
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    plain, spec = run(None, args.max_tokens, args.runs), run(ngram, args.max_tokens, args.runs)
    plain_sync = run(None, args.max_tokens, args.runs, async_scheduling=False)  # what speculation runs without
    assert plain["tokens"] == spec["tokens"] == plain_sync["tokens"], "greedy outputs differ"
    print(json.dumps({"prompt_tokens": plain["prompt_tokens"], "max_tokens": args.max_tokens,
                      "no_speculation_tok_s": round(plain["tok_s"], 2),
                      "no_speculation_no_async_tok_s": round(plain_sync["tok_s"], 2),
                      "ngram_tok_s": round(spec["tok_s"], 2),
                      "speedup": round(spec["tok_s"] / plain["tok_s"], 2), "ngram": ngram,
                      "acceptance_rate": spec["acceptance_rate"] and round(spec["acceptance_rate"], 3),
                      "mean_accepted_per_draft": spec["mean_accepted_per_draft"]
                      and round(spec["mean_accepted_per_draft"], 2)}, indent=1))


if __name__ == "__main__":
    main()
