"""Where each engine and server knob is declared: as a field of a configuration or start-up class (those below,
today's and the ones they replaced) or as a command-line flag of `tinyvllm serve`, `worker` or `bench throughput`
written by hand (add_argument in the files below).

    python benchmarks/knob_declarations.py [ROOT]   # ROOT: a checkout (default: this one)

A knob declared once has one place: its field in protocol/engine_config.py (or frontend/api/server_options.py), from
which the flags are made. Messages that report resolved values (EngineReady, WorkerReady) are not declarations.
"""
import ast
import pathlib
import sys
from collections import defaultdict

PRODUCT = ("frontend", "scheduler", "workers", "protocol")
CONFIG_CLASSES = {"EngineArgs", "SchedulerArgs", "SchedulerConfig", "WorkerArgs", "InitWorker", "ServerArgs",
                  "EngineConfig", "ModelOptions", "BatchConfig", "CacheConfig", "KernelConfig", "ParallelConfig",
                  "KVTransferConfig"}
FLAG_FILES = {"frontend/cli.py", "frontend/worker_command.py",  # before the frontend had layers
              "frontend/cli/main.py", "frontend/cli/worker_command.py"}


def _dest(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "dest" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [f for f in flags if f.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


def declarations(root: pathlib.Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            where = str(path.relative_to(root))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name in CONFIG_CLASSES:
                    for item in node.body:
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                                and ast.unparse(item.annotation) not in CONFIG_CLASSES:  # a part of the tree
                            found[item.target.id].append(f"{where}:{item.lineno} {node.name}")
                if where in FLAG_FILES and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "add_argument" and (dest := _dest(node)):
                    found[dest].append(f"{where}:{node.lineno} flag")
    return found


def main() -> None:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from tinyvllm.frontend.api.server_options import SERVER_KNOBS
    from tinyvllm.protocol.engine_config import KNOBS
    found = declarations(root)
    names = [*KNOBS, *SERVER_KNOBS, "cpu_kernels", "kv_cache_bytes", "swap_space_bytes", "tp_size", "pp_size"]
    print(f"{'knob':28} {'places':>6}  where")
    total = 0
    for name in names:
        places = found.get(name, [])
        if not places:
            continue
        total += len(places)
        print(f"{name:28} {len(places):>6}  {'; '.join(places)}")
    print(f"{'total':28} {total:>6}  ({len([n for n in names if found.get(n)])} names)")


if __name__ == "__main__":
    main()
