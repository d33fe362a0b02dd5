"""Drives a running Open WebUI (pointed at tinyvllm) through its own REST API; prints PASS/FAIL per item.

    python open_webui_drive.py OPEN_WEBUI_URL OLLAMA_MODEL_ID OPENAI_MODEL_ID TINYVLLM_URL

Run with the Open WebUI venv's python (it has httpx). Exit status 1 when any item failed.
"""
import json
import sys

import httpx

from open_webui_saved_chat import QUESTION, saved_chat

results: list[tuple[str, bool, str]] = []


def record(item: str, ok: bool, evidence: str):
    results.append((item, ok, evidence))
    print(f"{'PASS' if ok else 'FAIL'}  {item}: {evidence}", flush=True)


def sign_in(client: httpx.Client) -> str:
    """The first account signed up becomes the admin; a rerun on the same DATA_DIR signs in instead."""
    account = {"name": "admin", "email": "admin@example.com", "password": "tinyvllm-check"}
    reply = client.post("/api/v1/auths/signup", json=account)
    if reply.status_code != 200:
        reply = client.post("/api/v1/auths/signin", json={k: account[k] for k in ("email", "password")})
    reply.raise_for_status()
    body = reply.json()
    record("sign up the first admin", body.get("role") == "admin", f"role={body.get('role')}")
    return body["token"]


def check_models(client: httpx.Client, wanted: list[str]):
    reply = client.get("/api/models")
    ids = [m["id"] for m in reply.json().get("data", [])] if reply.status_code == 200 else []
    for model in wanted:
        record(f"model list has {model}", model in ids, f"HTTP {reply.status_code}, ids={ids}")


def check_proxied(client: httpx.Client):
    version = client.get("/ollama/api/version")
    record("Ollama connection: /ollama/api/version", version.status_code == 200 and "version" in version.json(),
           f"HTTP {version.status_code} {version.text[:80]}")
    models = client.get("/openai/models")
    record("OpenAI connection: /openai/models", models.status_code == 200 and bool(models.json().get("data")),
           f"HTTP {models.status_code}, {len(models.json().get('data', [])) if models.status_code == 200 else 0} models")


def check_admin_views(client: httpx.Client, base_url: str, ollama_model: str):
    """The admin's "verify connection" buttons and the model info Open WebUI fetches from Ollama."""
    for kind, url in (("ollama", base_url), ("openai", base_url + "/v1")):
        reply = client.post(f"/{kind}/verify", json={"url": url, "key": "none"})
        record(f"{kind} verify connection", reply.status_code == 200, f"HTTP {reply.status_code} {reply.text[:80]}")
    show = client.post("/ollama/api/show", json={"model": ollama_model})
    record("Ollama model info: /ollama/api/show", show.status_code == 200 and "model_info" in show.json(),
           f"HTTP {show.status_code}, keys={sorted(show.json())[:8] if show.status_code == 200 else show.text[:80]}")


def enable_usage(client: httpx.Client, model: str):
    """The model's "usage" capability (Admin > Models): Open WebUI then streams with include_usage."""
    body = {"id": model, "name": model, "base_model_id": None, "params": {}, "meta": {"capabilities": {"usage": True}}}
    reply = client.post("/api/v1/models/create", json=body)
    client.get("/api/models")  # Open WebUI reads capabilities from its model list, refreshed here as the UI does
    print(f"usage capability on {model}: HTTP {reply.status_code}", flush=True)


def streamed_chat(client: httpx.Client, model: str, label: str):
    body = {"model": model, "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Say hello in one sentence."}]}
    pieces, done, status, usage = [], False, None, None
    with client.stream("POST", "/api/chat/completions", json=body) as reply:
        status = reply.status_code
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                pieces.append((choice.get("delta") or {}).get("content") or "")
    text = "".join(pieces)
    ok = status == 200 and done and len([p for p in pieces if p]) > 1 and bool(text.strip())
    record(f"{label}: streamed chat", ok, f"HTTP {status}, {len(pieces)} chunks, [DONE]={done}, text={text[:60]!r}, usage={usage}")
    return usage


def task(client: httpx.Client, model: str, label: str, name: str, wanted_key: str):
    conversation = [{"role": "user", "content": "What is the capital of France?"},
                    {"role": "assistant", "content": "The capital of France is Paris."}]
    reply = client.post(f"/api/v1/tasks/{name}/completions", json={"model": model, "messages": conversation})
    body = reply.json() if reply.headers.get("content-type", "").startswith("application/json") else {}
    content = ((body.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    parsed = "no JSON"
    try:  # Open WebUI's UI parses the JSON object between the first { and the last }
        doc = json.loads(content[content.index("{"):content.rindex("}") + 1])
        parsed = f"{wanted_key}={doc.get(wanted_key)!r}" if isinstance(doc, dict) else "not an object"
    except ValueError:
        pass
    record(f"{label}: {name} task", reply.status_code == 200 and bool(content.strip()),
           f"HTTP {reply.status_code}, content={content[:60]!r}, UI parse: {parsed}")


def checked(item: str, check, *args):
    """A timeout or a dropped connection is that item's FAIL, not the end of the run."""
    try:
        return check(*args)
    except httpx.HTTPError as e:
        record(item, False, f"{type(e).__name__}: {e}")


def check_saved_chat(client: httpx.Client, model: str, label: str):
    """Title, follow-ups and tags as the UI gets them: background tasks after a new chat. Whether the model's text
    held the JSON Open WebUI parses (else: the question as the title, no follow-ups, no tags) is the model's doing,
    so it is shown, not judged; the task requests themselves are in the proxy's log."""
    chat = saved_chat(client, model)
    record(f"{label}: saved chat answered", chat["finished"] and bool(chat["answer"].strip()),
           f"finished={chat['finished']}, answer={chat['answer'][:50]!r}")
    source = "the question (fallback)" if chat["title"] == QUESTION else "the model"
    record(f"{label}: saved chat titled", bool(chat["title"]),
           f"title={chat['title']!r} from {source}, follow_ups={chat['follow_ups']}, tags={chat['tags']}")


def main():
    url, ollama_model, openai_model = sys.argv[1:4]  # argv[4]: the base URL Open WebUI reaches tinyvllm at
    with httpx.Client(base_url=url, timeout=300) as client:
        token = sign_in(client)
        client.headers["Authorization"] = f"Bearer {token}"
        check_models(client, [ollama_model, openai_model])
        check_proxied(client)
        check_admin_views(client, sys.argv[4], ollama_model)
        config = client.get("/api/v1/tasks/config").json()
        print("task config:", {k: v for k, v in config.items() if k.startswith("ENABLE")}, flush=True)
        for model, label in ((ollama_model, "Ollama"), (openai_model, "OpenAI")):
            checked(f"{label}: streamed chat", streamed_chat, client, model, label)
            enable_usage(client, model)
            usage = checked(f"{label}: streamed chat with usage", streamed_chat, client, model, label + " (usage on)")
            record(f"{label}: usage reported", bool(usage and usage.get("completion_tokens")), f"usage={usage}")
            for name, wanted_key in (("title", "title"), ("follow_up", "follow_ups"), ("tags", "tags")):
                checked(f"{label}: {name} task", task, client, model, label, name, wanted_key)
            checked(f"{label}: saved chat", check_saved_chat, client, model, label)
    failed = [item for item, ok, _ in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
