"""The wheel installs one top-level package, tinyvllm, with the repository's folders beneath it (pyproject.toml's
package-dir), the C kernels inside, and `from tinyvllm import LLM, SamplingParams` working from it alone."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "tinyvllm", "frontend", "scheduler", "workers", "protocol")


def test_the_wheel_holds_one_top_level_package_that_imports(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True)
    wheel = next((tmp_path / "dist").glob("tinyvllm-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"tinyvllm", wheel.name.split("-py3")[0] + ".dist-info"}
    assert {"tinyvllm/frontend/api/server.py", "tinyvllm/workers/c/attention.c", "tinyvllm/workers/c/kernel.h",
            "tinyvllm/protocol/messages.py", "tinyvllm/scheduler/scheduler.py",
            "tinyvllm/frontend/api/dashboard.html"} <= set(names)

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    code = ("import tinyvllm, tinyvllm.frontend.cli.main; from tinyvllm import LLM, SamplingParams; "
            "print(tinyvllm.__file__, LLM.__module__, SamplingParams.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(site / "tinyvllm" / "__init__.py"), "tinyvllm.frontend.engine.llm", "SamplingParams"]
