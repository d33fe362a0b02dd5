"""The router's background checks: /health and /metrics of static and DNS instances (real sockets), the load read
from vLLM's gauges, and DNS discovery (a name that stops resolving leaves the list as it was)."""
import pathlib

import httpx
import pytest

from tests.router.harness import RawUpstream, refused_url
from tinyvllm.frontend.router.dns_discovery import instance_url, parse_target
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_monitor import InstanceMonitor, load_from_metrics
from tinyvllm.frontend.router.instance_registry import DNS, ROUTABLE, STATIC, UNHEALTHY, InstanceRegistry, Load

pytestmark = pytest.mark.anyio

METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.25
"""


def test_the_load_is_summed_over_engines():
    assert load_from_metrics(METRICS.decode()) == Load(running=3, waiting=4, kv_usage=0.375)
    assert load_from_metrics("") == Load()


def reference_load(text: str) -> Load:
    """The load as prometheus_client's own parser reads the page."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    kv = [s.value for s in samples if s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]
    return Load(int(sum(s.value for s in samples if s.name == "vllm:num_requests_running")),
                int(sum(s.value for s in samples if s.name == "vllm:num_requests_waiting")),
                sum(kv) / len(kv) if kv else 0.0)


async def test_the_load_of_a_whole_metrics_page_is_what_prometheus_client_reads():
    """A real server's page (histograms, counters, every family), and vLLM's older names, labels holding spaces and
    braces, timestamps: the load is found without parsing the rest, and equals the library's reading."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "frontend"))
    try:
        from app_harness import make_app
    finally:
        sys.path.pop(0)
    app, _, _ = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://instance") as client:
        page = (await client.get("/metrics")).text
    assert "vllm:num_requests_running{" in page and "_bucket{" in page
    tricky = page + """# TYPE vllm:num_requests_running_extra gauge
vllm:num_requests_running_extra 50.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="a } b",engine="9"} 0.75 1700000000000
vllm:num_requests_waiting{model_name="with space"} 7
vllm:num_requests_running {engine="8"} 0
"""
    assert load_from_metrics(tricky) == reference_load(tricky) == Load(0, 7, reference_load(tricky).kv_usage)
    assert load_from_metrics(METRICS.decode()) == reference_load(METRICS.decode())
    for wrong in ("3x", "+Inf", "NaN"):  # a health check that fails, not a round of them that stops
        with pytest.raises(ValueError):
            load_from_metrics(f"vllm:num_requests_running {wrong}\n")
    with pytest.raises(ValueError, match="none of vLLM's"):  # an error page answered with 200
        load_from_metrics("<html><body>Bad gateway</body></html>")


async def test_health_checks_make_static_instances_routable_or_not():
    async def healthy(exchange):
        if exchange.path == "/health":
            await exchange.whole(200, b"")
        else:
            await exchange.whole(200, METRICS, content_type="text/plain")

    async def draining(exchange):
        await exchange.whole(503, b'{"error": {"message": "shutting down"}}')

    registry = InstanceRegistry()
    dead = refused_url()
    async with RawUpstream(healthy) as up, RawUpstream(draining) as down, \
            InstanceClients(trust_env=False) as client:
        for url in (up.url, down.url, dead):
            registry.add(url, STATIC)
        await InstanceMonitor(registry, client).check_health()
        assert registry.state(registry.get(up.url)) == ROUTABLE
        assert registry.get(up.url).load == Load(running=3, waiting=4, kv_usage=0.375)
        assert registry.state(registry.get(down.url)) == UNHEALTHY
        assert registry.state(registry.get(dead)) == UNHEALTHY
        assert [e.path for e in up.exchanges] == ["/health", "/metrics"]


async def test_dns_discovery_adds_what_the_name_resolves_to_and_keeps_the_list_when_it_stops_resolving():
    registry = InstanceRegistry()
    async with InstanceClients(trust_env=False) as client:
        monitor = InstanceMonitor(registry, client, {"both": parse_target("localhost:8123")})
        await monitor.discover()
        assert "http://127.0.0.1:8123" in {i.url for i in registry.all()}
        assert {i.source for i in registry.all()} == {DNS}
        known = {i.url for i in registry.all()}
        monitor.dns_targets = {"both": ("no-such-name.invalid", 8123)}
        await monitor.discover()
        assert {i.url for i in registry.all()} == known


async def test_each_role_is_discovered_by_its_own_name_and_a_name_that_stops_resolving_keeps_its_role():
    """Disaggregated instances found without registration (--discover-prefill-dns, --discover-decode-dns): what
    each name resolves to joins with that name's role, and one role's name leaving drains none of the other's."""
    registry = InstanceRegistry()
    async with InstanceClients(trust_env=False) as client:
        monitor = InstanceMonitor(registry, client, {"prefill": ("localhost", 8123), "decode": ("127.0.0.2", 8124)})
        await monitor.discover()
        roles = {i.url: i.role for i in registry.all()}
        assert roles["http://127.0.0.1:8123"] == "prefill" and roles == {**roles, "http://127.0.0.2:8124": "decode"}
        monitor.dns_targets["prefill"] = ("no-such-name.invalid", 8123)
        await monitor.discover()  # prefill's name fails: its instances stay
        assert {i.url: i.role for i in registry.all()} == roles
        registry.sync_dns(set(), "decode")  # decode's name resolves to nothing: only decode instances drain
        assert {i.url for i in registry.all() if not i.draining} == {u for u, r in roles.items() if r == "prefill"}


def test_dns_targets_and_urls():
    assert parse_target("tinyvllm.default.svc.cluster.local:8000") == ("tinyvllm.default.svc.cluster.local", 8000)
    assert instance_url("10.1.2.3", 8000) == "http://10.1.2.3:8000"
    assert instance_url("fd00::1", 8000) == "http://[fd00::1]:8000"
    for bad in ("name", "name:", ":8000", "name:99999"):
        with pytest.raises(ValueError):
            parse_target(bad)
