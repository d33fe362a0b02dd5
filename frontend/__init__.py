"""tinyvllm's frontend: the HTTP server, the CLI and the offline `LLM` API."""
from protocol.sampling import SamplingParams


def __getattr__(name):  # keep `import frontend.x` light: LLM pulls in the process launcher
    if name == "LLM":
        from frontend.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams"]
