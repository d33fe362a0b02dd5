"""tinyvllm: a small, fast LLM serving system on tinygrad.

    from tinyvllm import LLM, SamplingParams

The repository's folders are this package's subpackages (pyproject.toml's package-dir): tinyvllm.frontend (HTTP
server, CLI, offline LLM), tinyvllm.scheduler, tinyvllm.workers, tinyvllm.protocol (the messages between them, and
the model files they all read).
"""
import os as _os

if not _os.path.isdir(_os.path.join(__path__[0], "protocol")):
    # a source checkout (not a wheel): the subpackages are the repository's folders beside this one, so that
    # PYTHONPATH=<checkout> works too (an editable install maps them the same way)
    __path__.append(_os.path.dirname(__path__[0]))

from tinyvllm.protocol.sampling import BeamSearchParams, LoRARequest, SamplingParams  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name):  # `import tinyvllm` stays light: LLM pulls in the process launcher
    if name == "LLM":
        from tinyvllm.frontend.engine.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "LoRARequest"]
