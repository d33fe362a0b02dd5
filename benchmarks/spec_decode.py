"""Single-stream decode speed with n-gram speculative decoding against none, on a task whose output copies its prompt
(editing code: the same functions with a variable renamed), and the acceptance rate; with --draft-model PATH also
draft-model speculation (a smaller model with the same tokenizer; "default" names the target itself, whose greedy
proposals are all accepted: the mechanism's cost at full acceptance).

Each configuration is its own engine, all started together (async scheduling on, off, and off with n-gram
speculation, which turns it off); one untimed run of the same request first captures the jits (its prompt then comes
from the prefix cache in the timed runs, alike for all); then the runs go round the engines, and each keeps its best.
Greedy, so all produce the same tokens.

    DEV=CPU .venv/bin/python benchmarks/spec_decode.py [--max-tokens 192] [--runs 5] [--k 3] [--draft-model PATH]
"""
import argparse
import contextlib
import json
import time

from tinyvllm.frontend.engine.llm import LLM
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


CONFIGS = {"no_speculation": dict(speculative_config=None),
           "no_speculation_no_async": dict(speculative_config=None, async_scheduling=False),  # what speculation runs without
           "ngram": dict(speculative_config=None)}  # filled in by main


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--draft-model", default=None, help="also speculate with this draft model (.gguf, HF folder)")
    args = parser.parse_args()
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    CONFIGS["ngram"] = dict(speculative_config=ngram)
    if args.draft_model:
        CONFIGS["draft_model"] = dict(speculative_config={"method": "draft_model", "model": args.draft_model,
                                                          "num_speculative_tokens": args.k})
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    # All engines at once, their runs interleaved, the best of each kept: the machine is shared and its load drifts.
    with contextlib.ExitStack() as stack:
        llms = {name: stack.enter_context(LLM(max_num_seqs=1, max_model_len=1024, num_kv_blocks=128, **kw))
                for name, kw in CONFIGS.items()}
        ids = llms["ngram"].tokenizer.encode(PROMPT)
        for llm in llms.values():
            llm.generate([ids], greedy)  # captures the jits
        before = {name: llm.stats for name, llm in llms.items()}
        best, tokens = dict.fromkeys(llms, float("inf")), {}
        for _ in range(args.runs):
            for name, llm in llms.items():
                start = time.perf_counter()
                tokens[name] = llm.generate([ids], greedy)[0].token_ids
                best[name] = min(best[name], time.perf_counter() - start)
        after = {name: llm.stats for name, llm in llms.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1, "greedy outputs differ"
    tok_s = {name: len(tokens[name]) / seconds for name, seconds in best.items()}
    report = {"prompt_tokens": len(ids), "max_tokens": args.max_tokens, "runs": args.runs, "ngram": ngram,
              **{f"{name}_tok_s": round(v, 2) for name, v in tok_s.items()}}
    for name in [n for n in ("ngram", "draft_model") if n in llms]:
        drafted = after[name].spec_num_draft_tokens - before[name].spec_num_draft_tokens
        accepted = after[name].spec_num_accepted_tokens - before[name].spec_num_accepted_tokens
        drafts = after[name].spec_num_drafts - before[name].spec_num_drafts
        prefix = "" if name == "ngram" else "draft_model_"  # the n-gram keys as before
        report.update({f"{prefix}speedup_vs_no_speculation": round(tok_s[name] / tok_s["no_speculation"], 2),
                       f"{prefix}acceptance_rate": round(accepted / drafted, 3) if drafted else None,
                       f"{prefix}mean_accepted_per_draft": round(accepted / drafts, 2) if drafts else None})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
