"""The HTTP process reads model files through protocol/ and imports neither tinygrad nor the workers package."""
import json
import subprocess
import sys

import pytest

FRONTEND_MODULES = ("tinyvllm.frontend.api.server", "tinyvllm.frontend.engine.launcher", "tinyvllm.protocol.tokenizer",
                    "tinyvllm.frontend.cli.main", "tinyvllm.protocol.engine_config",
                    "tinyvllm.frontend.api.ollama.routes", "tinyvllm.frontend.api.ollama.create_routes",
                    "tinyvllm.frontend.api.ollama.pull_routes", "tinyvllm.frontend.api.ollama.model_info")
MODEL_FILE_MODULES = ("tinyvllm.protocol.gguf_file", "tinyvllm.protocol.model_config", "tinyvllm.protocol.model_path")
READ_DEFAULT_MODEL = """
from tinyvllm.frontend.api.ollama.model_info import read_weights_info
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import resolve_model_path
path = resolve_model_path(None)
read_model_config(path), Tokenizer.from_model_path(path), read_weights_info(path)
"""


def worker_side_modules_after(code: str) -> list[str]:
    """The tinygrad and tinyvllm.workers modules a fresh interpreter has loaded after running `code`."""
    report = "\nimport json, sys\nprint(json.dumps(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code + report], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.splitlines()[-1])
    return sorted(m for m in loaded if m.split(".")[0] == "tinygrad" or m.startswith("tinyvllm.workers"))


@pytest.mark.parametrize("modules", [FRONTEND_MODULES, MODEL_FILE_MODULES], ids=["frontend", "protocol-model-files"])
def test_importing_loads_no_tinygrad_or_worker_code(modules):
    assert worker_side_modules_after("".join(f"import {m}\n" for m in modules)) == []


def test_reading_the_default_model_loads_no_tinygrad_or_worker_code():
    assert worker_side_modules_after(READ_DEFAULT_MODEL) == []
