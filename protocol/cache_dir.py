"""Where tinyvllm keeps what it can rebuild: ~/.cache/tinyvllm, or $XDG_CACHE_HOME/tinyvllm."""
import os
from pathlib import Path


def cache_dir() -> Path:
    """The C kernels' libraries and captured steps (workers), the Ollama model store and chat history (frontend)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tinyvllm"
