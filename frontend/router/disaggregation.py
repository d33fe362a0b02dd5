"""Disaggregated prefill/decode through the router (vLLM's toy proxy, tests/v1/kv_connector/nixl_integration).

When the routable instances include both a `--role prefill` and a `--role decode` one, a completion or chat request
goes first to a prefill instance as a copy with max_tokens=1, stream=false, no min_tokens and kv_transfer_params
{do_remote_decode: true}; the kv_transfer_params of its answer (where the prompt's KV blocks wait) are added to the
original request, which then goes to a decode instance and is answered from there as usual (streamed or not). A
prefill answer other than 200 goes back to the client as it came; one without kv_transfer_params (a one-token prompt)
leaves the original request as it was. A client's own kv_transfer_params are dropped; requests one instance must
serve whole (n > 1, the prompt's logprobs) are routed as usual.
"""
import json

import httpx

from tinyvllm.frontend.router import router_metrics as m
from tinyvllm.frontend.router.instance_registry import Instance

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
PREFILL, DECODE = "prefill", "decode"
PREFILL_TRIES = 3


def by_role(instances: list[Instance], role: str) -> list[Instance]:
    return [i for i in instances if i.role == role]


def disaggregates(method: str, path: str, routable: list[Instance]) -> bool:
    return (method == "POST" and path in GENERATION_PATHS and bool(by_role(routable, PREFILL))
            and bool(by_role(routable, DECODE)))


def parse_body(body: bytes) -> dict | None:
    """The request, without any kv_transfer_params of the client's (the router's own go to the instances); None when
    it is not JSON, or is a request one instance must serve whole: several choices (n), or the prompt's logprobs
    (prompt_logprobs, or echo with logprobs)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or (isinstance(parsed.get("n"), int) and parsed["n"] > 1) \
            or parsed.get("prompt_logprobs") is not None or (parsed.get("echo") and parsed.get("logprobs")):
        return None
    parsed.pop("kv_transfer_params", None)
    return parsed


def prefill_body(request: dict) -> bytes:
    body = {k: v for k, v in request.items() if k not in ("stream_options", "min_tokens", "max_completion_tokens")}
    body.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return json.dumps(body).encode()


def decode_body(request: dict, kv_transfer_params: dict | None) -> bytes:
    return json.dumps({**request, "kv_transfer_params": kv_transfer_params} if kv_transfer_params else request).encode()


class PrefillReply(Exception):
    """The prefill instance's answer was not a 200: it goes to the client as it came."""

    def __init__(self, status: int, headers: list, body: bytes):
        self.status, self.headers, self.body = status, headers, body


async def run_prefill(proxy, target: str, headers: list, request: dict, hashes: list[bytes]) -> dict | None:
    """The prefill instance's kv_transfer_params (None: it returned none); PrefillReply for a non-200 answer;
    None too when no prefill instance could be reached (the decode instance then computes the prompt itself)."""
    content, tried = prefill_body(request), set()
    for _ in range(PREFILL_TRIES):
        candidates = [i for i in by_role(proxy.registry.routable(), PREFILL) if i.url not in tried]
        if (choice := proxy.picker.pick(candidates, hashes)) is None:
            break
        instance, reason = choice
        tried.add(instance.url)
        proxy.metrics.decisions.labels(instance.url, f"prefill-{reason}").inc()
        proxy.registry.opened(instance)
        proxy.picker.opened(instance, hashes)
        try:
            with proxy.clients.using(instance.url) as client:
                reply = await client.post(instance.url + target, headers=headers, content=content)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            proxy.registry.unreachable(instance)
            proxy._failed(instance, m.CONNECT_FAILED, e)
            continue
        except httpx.TransportError as e:
            proxy._failed(instance, m.DROPPED, e)
            continue
        finally:
            proxy.registry.closed(instance)
            proxy.picker.closed(instance)
        if reply.status_code == 503:
            proxy._failed(instance, m.UNAVAILABLE, None)
            continue
        if reply.status_code != 200:
            raise PrefillReply(reply.status_code, [(b"content-type", b"application/json")], reply.content)
        try:
            answer = json.loads(reply.content)
        except ValueError:
            return None
        return answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    return None
