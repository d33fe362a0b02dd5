"""`tinyvllm router`'s flags (a router beyond loopback needs a register secret) and `tinyvllm serve
--register-with`'s (the advertised URL, the secret)."""
import pytest

import tinyvllm.frontend.api.server as server_module
from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.router.command import router_args_from
from tinyvllm.frontend.api.router_registration import Registration, registration_from

SECRET = "0123456789abcdef"


def router_args(*argv: str, environ=None):
    return router_args_from(cli.build_parser().parse_args(["router", *argv]), environ or {})


def test_router_defaults():
    args = router_args()
    assert (args.host, args.port, args.instances, args.discover_dns) == ("127.0.0.1", 8080, [], None)
    assert (args.discover_interval_s, args.heartbeat_timeout_s, args.shutdown_timeout_s) == (5.0, 6.0, 30.0)
    assert (args.api_key, args.instance_api_key, args.register_secret, args.tokenizer) == (None, None, "", None)


def test_router_flags_and_environment():
    args = router_args("--instances", "http://10.0.0.2:8000/", "http://10.0.0.3:8000", "--discover-dns",
                       "tinyvllm.default.svc.cluster.local:8000", "--host", "0.0.0.0",
                       environ={"TINYVLLM_ROUTER_SECRET": SECRET, "TINYVLLM_API_KEY": "client-key",
                                "TINYVLLM_INSTANCE_API_KEY": "instance-key"})
    assert args.instances == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    assert (args.prefill, args.decode) == ([], [])
    pd = router_args("--prefill", "http://10.0.0.4:8000/", "--decode", "http://10.0.0.5:8000", "http://10.0.0.6:8000")
    assert (pd.prefill, pd.decode) == (["http://10.0.0.4:8000"], ["http://10.0.0.5:8000", "http://10.0.0.6:8000"])
    from tinyvllm.frontend.router.instance_registry import STATIC, InstanceRegistry
    registry = InstanceRegistry()
    assert registry.add(pd.prefill[0], STATIC, "prefill").role == "prefill"  # as serve_router adds them
    assert args.discover_dns == ("tinyvllm.default.svc.cluster.local", 8000)
    assert args.dns_targets == {"both": ("tinyvllm.default.svc.cluster.local", 8000)}
    assert (args.register_secret, args.api_key, args.instance_api_key) == (SECRET, "client-key", "instance-key")
    assert router_args("--tokenizer", "SmolLM2-135M-Instruct").tokenizer.endswith(".gguf")  # the default model's file


def test_the_router_tokenizer_may_be_a_folder_of_tokenizer_files_alone(tmp_path, default_tokenizer):
    from tinyvllm.protocol.tokenizer import Tokenizer
    (tmp_path / "tokenizer.json").write_text(default_tokenizer.hf.to_str())
    path = router_args("--tokenizer", str(tmp_path)).tokenizer
    assert path == str(tmp_path.resolve())
    assert Tokenizer.from_model_path(path).encode("Hi") == default_tokenizer.encode("Hi")
    roles = router_args("--discover-prefill-dns", "tinyvllm-prefill:8000", "--discover-decode-dns", "tinyvllm-decode:8001")
    assert roles.dns_targets == {"prefill": ("tinyvllm-prefill", 8000), "decode": ("tinyvllm-decode", 8001)}


@pytest.mark.parametrize("argv, words", [
    (("--host", "0.0.0.0"), "TINYVLLM_ROUTER_SECRET"),
    (("--register-secret", "short"), "too short"),
    (("--instances", "10.0.0.2:8000"), "not a base URL"),
    (("--discover-dns", "no-port"), "NAME:PORT"),
    (("--discover-decode-dns", "tinyvllm-decode"), "NAME:PORT"),
    (("--heartbeat-timeout", "0"), "positive"),
    (("--api-key", ""), "must not be empty"),
    (("--tokenizer", "/nonexistent/model.gguf"), "--tokenizer: model .* not found"),
])
def test_router_mistakes(argv, words):
    with pytest.raises(ValueError, match=words):
        router_args(*argv)


def test_the_router_command_refuses_to_listen_beyond_loopback_without_a_secret(monkeypatch, capsys):
    monkeypatch.delenv("TINYVLLM_ROUTER_SECRET", raising=False)
    assert cli.main(["router", "--host", "0.0.0.0"]) == 2
    assert "authenticates its peers" in capsys.readouterr().err


def test_serve_registration():
    assert registration_from(None, None, None, "127.0.0.1", 8000, {}) is None
    assert registration_from("http://127.0.0.1:8080/", None, None, "127.0.0.1", 8001, {}) == \
        Registration("http://127.0.0.1:8080", "http://127.0.0.1:8001", "")
    assert registration_from("http://r:8080", "http://10.0.0.5:9000", None, "0.0.0.0", 8000,
                             {"TINYVLLM_ROUTER_SECRET": SECRET}) == Registration("http://r:8080",
                                                                                 "http://10.0.0.5:9000", SECRET)
    wildcard = registration_from("http://127.0.0.1:8080", None, SECRET, "0.0.0.0", 8000, {})
    assert wildcard.advertise_url == "http://127.0.0.1:8000"  # the address on the route to the router


@pytest.mark.parametrize("args, words", [
    ((None, "http://10.0.0.5:9000", None), "needs --register-with"),
    (("tcp://r:8080", None, None), "not a base URL"),
    (("http://r:8080", None, "short"), "too short"),
])
def test_serve_registration_mistakes(args, words):
    with pytest.raises(ValueError, match=words):
        registration_from(*args, "127.0.0.1", 8000, {})


def test_serve_passes_its_registration_to_the_server(monkeypatch):
    calls = []
    monkeypatch.setattr(server_module, "serve", lambda engine_args, server_args: calls.append(server_args))
    monkeypatch.setenv("TINYVLLM_ROUTER_SECRET", SECRET)
    assert cli.main(["serve", "--port", "8001", "--register-with", "http://127.0.0.1:8080"]) == 0
    assert calls[0].registration == Registration("http://127.0.0.1:8080", "http://127.0.0.1:8001", SECRET)
