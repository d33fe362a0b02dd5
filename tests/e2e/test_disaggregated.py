"""Disaggregated prefill/decode through real processes: a `--role prefill` instance computes the prompt and leases its
KV blocks, a `--role decode` instance pulls them over the workers' KV side channel and decodes; greedy outputs are
the same as one `--role both` instance's, the decode instance computed only the prompt's last token, and the prefill
instance's blocks are all back in its pool afterwards."""
import httpx

from tests.e2e.server_process import MODEL_NAME, read_metric, wait_until

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."


def complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0, **body},
                   timeout=240)
    assert r.status_code == 200, r.text
    return r.json()


def test_prefill_then_decode_equals_one_instance(server_factory):
    both = server_factory()
    prefill = server_factory("--role", "prefill", "--block-size", "4")
    decode = server_factory("--role", "decode", "--block-size", "4")

    reference = complete(both.url, max_tokens=12)
    first = complete(prefill.url, max_tokens=1, kv_transfer_params={"do_remote_decode": True, "unknown_key": 1})
    kv = first["kv_transfer_params"]
    num_prompt = first["usage"]["prompt_tokens"]
    assert kv["do_remote_prefill"] and not kv["do_remote_decode"] and kv["remote_host"] == "127.0.0.1"
    assert len(kv["remote_block_ids"]) == -(-(num_prompt - 1) // 4) and kv["tp_size"] == 1
    assert read_metric(prefill.url, "vllm:kv_cache_usage_perc") > 0  # leased until the decode pulls

    answer = complete(decode.url, max_tokens=12, kv_transfer_params=kv)
    assert answer["choices"][0]["text"] == reference["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens"] == num_prompt
    # the decode instance computed only the last prompt token: the rest came from the prefill instance
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_prompt - 1
    assert wait_until(lambda: read_metric(prefill.url, "vllm:kv_cache_usage_perc") == 0.0, 30), "lease not released"
    assert wait_until(lambda: read_metric(decode.url, "vllm:kv_cache_usage_perc") == 0.0, 30)


def test_a_decode_whose_prefill_is_gone_fails_explicitly(server_factory, monkeypatch):
    monkeypatch.setenv("TINYVLLM_KV_PULL_TIMEOUT_S", "2")
    decode = server_factory("--role", "decode", "--block-size", "4")
    count = httpx.post(decode.url + "/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}, timeout=60).json()["count"]
    gone = {"do_remote_prefill": True, "remote_block_ids": list(range(-(-(count - 1) // 4))), "remote_host": "127.0.0.1",
            "remote_port": 9, "remote_request_id": "cmpl-x", "remote_engine_id": "e", "tp_size": 1}
    r = httpx.post(decode.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4,
                                                          "kv_transfer_params": gone}, timeout=120)
    assert r.status_code in (400, 500), r.text
    assert "KV" in r.json()["error"]["message"], r.text
