"""Request-parsing cost: a JSON body (already decoded) -> what the route hands to generation, in µs per parse.

    DEV=CPU python benchmarks/request_parsing.py [--runs 20000]

Three requests: a typical chat request, a completion request with many fields, an Ollama /api/generate request
(its fields and options). Each row: the median of --runs single parses (after a warm-up), and the 10th and 90th
percentiles. Prints a table.
"""
import argparse
import statistics
import time

from tinyvllm.frontend.api.ollama.options import generation_settings
from tinyvllm.frontend.api.ollama.prompting import check_context
from tinyvllm.frontend.api.ollama.requests import GenerateRequest
from tinyvllm.frontend.api.openai_protocol import parse_chat_request, parse_completion_request
from tinyvllm.frontend.api.request_models import validate

CHAT = {"model": "smollm2-135m-instruct", "temperature": 0.7, "max_tokens": 128, "stream": True,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Write a haiku about the sea."}]}
COMPLETION = {"model": "smollm2-135m-instruct", "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.8,
              "top_p": 0.95, "top_k": 40, "min_p": 0.05, "n": 2, "seed": 1234, "stop": ["\n\n", "END"],
              "stop_token_ids": [2, 3], "presence_penalty": 0.5, "frequency_penalty": 0.2,
              "repetition_penalty": 1.1, "logit_bias": {"42": 1.5, "7": -2}, "logprobs": 2, "echo": False,
              "min_tokens": 4, "ignore_eos": False, "skip_special_tokens": True, "include_stop_str_in_output": False,
              "stream": True, "stream_options": {"include_usage": True}, "user": "bench"}
OLLAMA_GENERATE = {"model": "smollm2-135m-instruct", "prompt": "Why is the sky blue?", "system": "Be brief.",
                   "stream": False, "keep_alive": "5m", "context": [1, 2, 3, 4],
                   "options": {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "num_predict": 100, "seed": 7,
                               "stop": ["\n"], "num_ctx": 2048, "repeat_penalty": 1.1}}


def parse_ollama_generate(body: dict):
    """What POST /api/generate reads from the body before templating (the model lookup left out)."""
    req = validate(GenerateRequest, body)
    return req.model_name, check_context(req.context, 50_000), generation_settings({}, req.options)


CASES = [("chat (typical)", parse_chat_request, CHAT),
         ("completion (many fields)", parse_completion_request, COMPLETION),
         ("ollama generate", parse_ollama_generate, OLLAMA_GENERATE)]


def timings_us(parse, body: dict, runs: int) -> list[float]:
    for _ in range(min(runs, 1000)):
        parse(body)
    out = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        parse(body)
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20000)
    args = ap.parse_args()
    print(f"{'request':<26} {'median µs':>10} {'p10 µs':>8} {'p90 µs':>8}")
    for name, parse, body in CASES:
        t = sorted(timings_us(parse, body, args.runs))
        print(f"{name:<26} {statistics.median(t):>10.2f} {t[len(t) // 10]:>8.2f} {t[len(t) * 9 // 10]:>8.2f}")


if __name__ == "__main__":
    main()
