"""A model file served as users serve it: load time, the worker's resident memory next to the file's size and the
KV cache it was given, and one request's decode speed.

    python benchmarks/model_memory.py MODEL.gguf [--kv-blocks 256] [--tokens 64] [--kernels c-int8] [--load-format auto]

Memory is read from the worker's /proc/<pid>/status (VmRSS now, VmHWM its peak); "overhead" is the resident memory
beyond the weights' device bytes and the KV cache (on the CPU backend, where both live in the worker's memory).
Works on shape twins (benchmarks/shape_twin.py): their text is gibberish, their sizes and speed are the real model's.
"""
import argparse
import os
import pathlib
import time

from tinyvllm import LLM, SamplingParams
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.workers.kv_cache import bytes_per_block


def worker_pids() -> list[int]:
    """This machine's tinyvllm worker processes (run the benchmark alone)."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"tinyvllm.workers.main" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def status_kb(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--load-format", default="auto", help="direct, packed or auto (a packed model's pages are mapped "
                                                          "from its pack: file-backed, counted in RSS as they are read)")
    args = ap.parse_args()
    started = time.monotonic()
    with LLM(args.model, num_kv_blocks=args.kv_blocks, max_num_seqs=4, max_model_len=2048, kernels=args.kernels,
             load_format=args.load_format) as llm:
        loaded_s = time.monotonic() - started
        (worker,) = worker_pids()
        greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        llm.generate(["The history of the bicycle"], greedy)  # the same shapes once first: their steps captured
        t = time.monotonic()
        out = llm.generate(["The history of the bicycle"], greedy)[0]
        decode_s = time.monotonic() - t
        rss, peak = status_kb(worker, "VmRSS") * 1024, status_kb(worker, "VmHWM") * 1024
        weights = llm.ready.worker_weight_bytes[0]
        kv = llm.ready.num_blocks * bytes_per_block(read_model_config(args.model), llm.ready.block_size,
                                                    llm.ready.kv_cache_dtype)
    gb = lambda b: f"{b / 1e9:.2f}"
    print("| file GB | weights on device GB | KV cache GB | worker RSS GB (peak) | overhead GB | load s | "
          "decode tok/s (1 request) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {gb(os.path.getsize(args.model))} | {gb(weights)} | {gb(kv)} | {gb(rss)} ({gb(peak)}) | "
          f"{gb(rss - weights - kv)} | {loaded_s:.1f} | {len(out.token_ids) / decode_s:.1f} |")


if __name__ == "__main__":
    main()
