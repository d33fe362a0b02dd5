"""tinyvllm: a small, fast LLM serving system on tinygrad.

    from tinyvllm import LLM, SamplingParams

The repository's folders are this package's subpackages (pyproject.toml's package-dir): tinyvllm.frontend (HTTP
server, CLI, offline LLM), tinyvllm.scheduler, tinyvllm.workers, tinyvllm.protocol (the messages between them, and
the model files they all read).
"""
from tinyvllm.protocol.sampling import SamplingParams

__version__ = "0.1.0"


def __getattr__(name):  # `import tinyvllm` stays light: LLM pulls in the process launcher
    if name == "LLM":
        from tinyvllm.frontend.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams"]
