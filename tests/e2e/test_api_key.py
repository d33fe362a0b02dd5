"""`tinyvllm serve` with $TINYVLLM_API_KEY (the --api-key default): /v1 and /api need the key, the rest stays open."""
import httpx

from tests.e2e.server_process import MODEL_NAME

KEY = "e2e-secret-key"


def test_the_key_guards_v1_and_api_only(server_factory, monkeypatch):
    monkeypatch.setenv("TINYVLLM_API_KEY", KEY)
    server = server_factory()
    assert "API key required" in server.log()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                        headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert client.post("/api/chat", json={}).json() == {"error": "unauthorized"}
        r = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL_NAME
        for path in ("/health", "/metrics", "/version", "/openapi.json"):
            assert client.get(path).status_code == 200, path
        assert client.post("/tokenize", json={"prompt": "hi"}).json()["count"] >= 1
        assert client.get("/openapi.json").json()["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
