"""Imports only go down: protocol <- scheduler, workers <- frontend/engine <- frontend/api (and frontend/router beside
it) <- frontend/cli. Read from the source, so an import inside a function counts too. Only the command line reaches
a worker's code (`tinyvllm worker` runs one in its own process); the engine starts the scheduler and the workers as
programs (protocol/child_process.py) and imports neither."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# package (a folder under the repository root, as tinyvllm.<dotted>) -> the packages it may import
ALLOWED = {
    "protocol": {"protocol"},
    "scheduler": {"protocol", "scheduler"},
    "workers": {"protocol", "workers"},
    "frontend/engine": {"protocol", "frontend.engine"},
    "frontend/api": {"protocol", "frontend.engine", "frontend.api"},
    "frontend/router": {"protocol", "frontend.engine", "frontend.api", "frontend.router"},
    "frontend/cli": {"protocol", "workers", "frontend.engine", "frontend.api", "frontend.router", "frontend.cli"},
}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name.removeprefix("tinyvllm.")) for line, name in found if name.startswith("tinyvllm.")]


def _allowed(package: str, module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in ALLOWED[package])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package):
    climbs = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            if not _allowed(package, module):
                climbs.append(f"{path.relative_to(ROOT)}:{line} imports tinyvllm.{module}")
    assert not climbs, "\n".join(climbs)


def test_every_frontend_module_is_in_a_layer():
    loose = [p.name for p in (ROOT / "frontend").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"frontend/ modules outside engine/, api/, cli/ and router/: {loose}"


def test_the_rule_itself_catches_a_climb(tmp_path):
    (tmp_path / "bad.py").write_text("def f():\n    from tinyvllm.frontend.api.app import build_app\n")
    assert _imports(tmp_path / "bad.py") == [(2, "frontend.api.app")]
    assert not _allowed("frontend/engine", "frontend.api.app") and _allowed("frontend/cli", "frontend.api.app")
