"""`tinyvllm serve --api-key` / $TINYVLLM_API_KEY reach the server; an empty --api-key is an error."""
import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.api.auth import resolve_api_key


@pytest.mark.parametrize("flag,env,expected", [
    (None, {}, None),
    (None, {"TINYVLLM_API_KEY": ""}, None),
    (None, {"TINYVLLM_API_KEY": "from-env"}, "from-env"),
    ("from-flag", {"TINYVLLM_API_KEY": "from-env"}, "from-flag"),
])
def test_flag_wins_over_the_environment(flag, env, expected):
    assert resolve_api_key(flag, env) == expected


def test_an_empty_flag_is_an_error():
    with pytest.raises(ValueError):
        resolve_api_key("", {})


def test_serve_passes_the_key_to_the_server(serve_calls, monkeypatch):
    assert cli.main(["serve", "--api-key", "k1"]) == 0
    monkeypatch.setenv("TINYVLLM_API_KEY", "k2")
    assert cli.main(["serve"]) == 0
    assert [server_args.api_key for _, server_args in serve_calls] == ["k1", "k2"]


def test_serve_refuses_an_empty_key(serve_calls, capsys):
    assert cli.main(["serve", "--api-key", ""]) == 2
    assert "--api-key must not be empty" in capsys.readouterr().err and not serve_calls


def test_help_does_not_show_the_environment_key(monkeypatch, capsys):
    monkeypatch.setenv("TINYVLLM_API_KEY", "secret-value")
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "secret-value" not in capsys.readouterr().out
