"""The router's connection pools: one per instance (httpcore's pool costs the square of its connections on every
request, so one pool for a fleet made the router's CPU per request grow with the fleet), closed once the instance has
left the registry and no proxied request still uses it."""
import asyncio

from tinyvllm.frontend.router.instance_clients import InstanceClients


def test_each_instance_has_its_own_pool_and_a_gone_one_is_closed_once_unused():
    async def scenario():
        async with InstanceClients(trust_env=False) as clients:
            a, b = clients.of("http://10.0.0.1:8000"), clients.of("http://10.0.0.2:8000")
            assert a is not b and clients.of("http://10.0.0.1:8000") is a and len(clients) == 2
            with clients.using("http://10.0.0.2:8000") as streaming:
                assert streaming is b
                await clients.keep(set())  # both left the registry; b still streams an answer
                assert a.is_closed and not b.is_closed and len(clients) == 1
            await clients.keep(set())
            assert b.is_closed and len(clients) == 0
            c = clients.of("http://10.0.0.3:8000")
        assert c.is_closed  # leaving the context closes every pool
    asyncio.run(scenario())
