"""Imports only go down: protocol <- scheduler, workers <- frontend (and inside it, the engine's control side <- the
HTTP API <- the command line). Read from the source, so an import inside a function counts too."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# package (a folder under the repository root, as tinyvllm.<dotted>) -> the packages it may import
ALLOWED = {
    "protocol": {"protocol"},
    "scheduler": {"protocol", "scheduler"},
    "workers": {"protocol", "workers"},
}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name.removeprefix("tinyvllm.")) for line, name in found if name.startswith("tinyvllm.")]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package):
    climbs = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            if module.split(".")[0] not in ALLOWED[package]:
                climbs.append(f"{path.relative_to(ROOT)}:{line} imports tinyvllm.{module}")
    assert not climbs, "\n".join(climbs)


def test_the_rule_itself_catches_a_climb(tmp_path):
    (tmp_path / "bad.py").write_text("def f():\n    from tinyvllm.frontend.app import build_app\n")
    assert _imports(tmp_path / "bad.py") == [(2, "frontend.app")]
