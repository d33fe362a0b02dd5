"""The README's offline example runs as written, the way a new user runs it: saved as a script with no
`if __name__ == "__main__":` guard, and piped to `python -`. (Started through multiprocessing's spawn, each engine
process re-ran the user's script and the engine failed to start.)"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def offline_example() -> str:
    text = README.read_text()
    section = text[text.index("Offline, through the same processes:"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_the_readme_offline_example_runs_as_written(tmp_path, how, default_model_path):
    code = offline_example()
    assert "__main__" not in code and "LLM()" in code
    if how == "script":
        (tmp_path / "example.py").write_text(code)
        run = dict(args=[sys.executable, "example.py"])
    else:
        run = dict(args=[sys.executable, "-"], input=code)
    done = subprocess.run(**run, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the default model's greedy answers to the two prompts (tests/reference holds them to transformers), then a story
    assert "Paris" in done.stdout and "4, 5" in done.stdout and len(done.stdout) > 60, done.stdout
    assert "engine failed to start" not in done.stderr
