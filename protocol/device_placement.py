"""Which device (or which CPU cores) the i-th of this machine's workers takes: the one rule for the launcher's
workers and for `tinyvllm worker --local-index I --local-count N` (what deploy/workers.sh starts)."""
import os


def device_placement(index: int, count: int, environ=os.environ) -> dict[str, str]:
    """Environment for worker `index` of `count` on this machine: device i of a GPU backend (DEV=CUDA -> CUDA:i),
    or on the CPU its share of the cores (tinygrad's thread count; the worker pins itself to them)."""
    dev = environ.get("DEV", "CPU")
    if dev.split(":")[0] != "CPU":
        return {"DEV": f"{dev.split(':')[0]}:{index}"} if count > 1 else {}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // count)
    mine = [cores[(index * share + j) % len(cores)] for j in range(share)]
    return {"NUM_CPU_THREADS": str(share), "TINYVLLM_CPU_CORES": ",".join(map(str, mine))} if count > 1 else {}
