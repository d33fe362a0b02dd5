"""The router's HTTP connections: one httpx client (a connection pool) per instance, not one for the whole fleet.

httpcore's pool does work in the square of its connections on every request's start and end, and the health checks
keep a connection to every instance in it: with one pool for the fleet, the router's CPU per request grew with the
fleet (7 ms at 32 instances, 29 at 128, 94 at 512; docs/SCALING.md). A pool per instance holds only that instance's
connections. The pools of instances that left the registry are closed by `keep` (the monitor calls it every pass),
once no request is `using` them: a registered instance whose heartbeats stopped leaves at once, but its streams go on.
"""
import asyncio
import contextlib
from collections import Counter

import httpx


class InstanceClients:
    def __init__(self, **client_options):
        """client_options: httpx.AsyncClient's (timeout, limits, trust_env, ...), the same for every instance."""
        # one TLS context for all: each client would load the CA bundle into its own (~0.6 MB a client)
        self.client_options = {"verify": httpx.create_ssl_context(), **client_options}
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._users: Counter[str] = Counter()  # url -> requests `using` its client now

    def __len__(self) -> int:
        return len(self._clients)

    def of(self, url: str) -> httpx.AsyncClient:
        """The client of the instance at `url` (its base URL, as the registry knows it)."""
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = httpx.AsyncClient(**self.client_options)
        return client

    @contextlib.contextmanager
    def using(self, url: str):
        """of(url) for a request that may outlive the instance's place in the registry (a proxied exchange)."""
        self._users[url] += 1
        try:
            yield self.of(url)
        finally:
            self._users[url] -= 1
            if not self._users[url]:
                del self._users[url]

    async def keep(self, urls: set[str]) -> None:
        """Closes the clients of the instances not in `urls` that no request is using."""
        gone = [self._clients.pop(url) for url in list(self._clients) if url not in urls and url not in self._users]
        await asyncio.gather(*(client.aclose() for client in gone))

    async def __aenter__(self) -> "InstanceClients":
        return self

    async def __aexit__(self, *exc) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))
