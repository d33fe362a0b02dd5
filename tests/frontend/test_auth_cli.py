"""`tinyvllm serve --api-key` / $TINYVLLM_API_KEY reach the server; an empty --api-key is an error."""
import pytest

import tinyvllm.frontend.server as server_module
from tinyvllm.frontend import cli


@pytest.mark.parametrize("flag,env,expected", [
    (None, {}, None),
    (None, {"TINYVLLM_API_KEY": ""}, None),
    (None, {"TINYVLLM_API_KEY": "from-env"}, "from-env"),
    ("from-flag", {"TINYVLLM_API_KEY": "from-env"}, "from-flag"),
])
def test_flag_wins_over_the_environment(flag, env, expected):
    assert cli.resolve_api_key(flag, env) == expected


def test_an_empty_flag_is_an_error():
    with pytest.raises(ValueError):
        cli.resolve_api_key("", {})


@pytest.fixture
def served_args(monkeypatch):
    seen = []
    monkeypatch.setattr(server_module, "serve", lambda engine_args, server_args: seen.append(server_args))
    monkeypatch.delenv("TINYVLLM_API_KEY", raising=False)
    return seen


def test_serve_passes_the_key_to_the_server(served_args, monkeypatch):
    assert cli.main(["serve", "--api-key", "k1"]) == 0
    monkeypatch.setenv("TINYVLLM_API_KEY", "k2")
    assert cli.main(["serve"]) == 0
    assert [a.api_key for a in served_args] == ["k1", "k2"]


def test_serve_refuses_an_empty_key(served_args, capsys):
    assert cli.main(["serve", "--api-key", ""]) == 2
    assert "--api-key must not be empty" in capsys.readouterr().err and not served_args


def test_help_does_not_show_the_environment_key(monkeypatch, capsys):
    monkeypatch.setenv("TINYVLLM_API_KEY", "secret-value")
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "secret-value" not in capsys.readouterr().out
