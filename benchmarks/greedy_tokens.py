"""Greedy tokens of the default model on one device, to hold against another device's (the GPU's against the CPU's).

    DEV=CPU  PYTHONPATH=. python benchmarks/greedy_tokens.py --out cpu.json      # here
    DEV=CUDA PYTHONPATH=. python benchmarks/greedy_tokens.py --out gpu.json      # on the GPU machine
    PYTHONPATH=. python benchmarks/greedy_tokens.py --compare cpu.json gpu.json

The prompts are tests/reference's (plain and chat-templated, short and ~300 tokens), 32 tokens each, through the
offline LLM (all of the engine's processes). Each position keeps its top-2 logprobs: --compare stops a prompt
at the first position where either side's top two are within 1e-3 (a near-tie, where the argmax is rounding
noise, as tests/reference/test_greedy_matches_hf.py does) and reports every other difference.
"""
import argparse
import json

from tests.reference.test_greedy_matches_hf import N_TOKENS, TIE_GAP, prompts


def generate(out: str, model: str | None) -> None:
    from tinygrad import Device
    from tinyvllm.frontend.engine.llm import LLM
    from tinyvllm.protocol.sampling import SamplingParams
    with LLM(model, max_num_seqs=8, max_model_len=1024, num_kv_blocks=256) as llm:
        ids = prompts(llm.tokenizer)
        results = llm.generate(ids, SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True, logprobs=2))
    rows = [{"token_ids": r.token_ids, "top2_gap": [lp.top_logprobs[0] - lp.top_logprobs[1] for lp in r.outputs[0].logprobs]}
            for r in results]
    with open(out, "w") as f:
        json.dump({"device": Device.DEFAULT, "prompts": rows}, f)
    print(f"{Device.DEFAULT}: {len(rows)} prompts, {sum(len(r['token_ids']) for r in rows)} tokens -> {out}")


def compare(a_path: str, b_path: str) -> bool:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    same = True
    for i, (x, y) in enumerate(zip(a["prompts"], b["prompts"], strict=True)):
        ties = [t for t in range(N_TOKENS) if min(x["top2_gap"][t], y["top2_gap"][t]) < TIE_GAP]
        upto = ties[0] if ties else N_TOKENS  # the tied position itself may go either way
        diff = next((t for t in range(upto) if x["token_ids"][t] != y["token_ids"][t]), None)
        same &= diff is None
        print(f"prompt {i}: " + ("equal" if diff is None else f"DIFFER at token {diff}") + f" over {upto} tokens"
              + (f" (near-tie at {ties[0]})" if ties else "") + f"; {a['device']} vs {b['device']}")
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        raise SystemExit(0 if compare(*args.compare) else 1)
    generate(args.out, args.model)


if __name__ == "__main__":
    main()
