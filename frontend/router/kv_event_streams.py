"""With `tinyvllm router --tokenizer`: every instance's GET /kv_events followed (frontend/api/kv_event_routes.py), so
the cache-aware policy knows the blocks each instance holds, whichever router replica routed the requests that
stored them, and forgets the ones it evicted.

One stream per known instance, opened when it joins and closed when it leaves, over the instance's own HTTP client
with the router's --instance-api-key. Each stream starts with the instance's whole set, which replaces what the
picker remembered of it; a broken stream (or one quiet for three of the instance's keep-alive intervals) is opened
again (after RETRY_S, doubling up to MAX_RETRY_S). The instances' block size, from the first stream, is what
prompt_tokens.py hashes with (DEFAULT_BLOCK_SIZE before).
"""
import asyncio
import json
import logging

import httpx

from tinyvllm.frontend.api.kv_event_routes import PATH, PING_S
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import Instance, InstanceRegistry
from tinyvllm.protocol.engine_config import CacheConfig

log = logging.getLogger("tinyvllm.router")
SYNC_INTERVAL_S = 0.5
RETRY_S, MAX_RETRY_S = 1.0, 16.0
MAX_LINE_BYTES = 64 << 20  # the first event holds every block hash of an instance: ~20 bytes each
DEFAULT_BLOCK_SIZE = CacheConfig().block_size


class KVEventStreams:
    def __init__(self, registry: InstanceRegistry, clients: InstanceClients, picker: InstancePicker,
                 instance_api_key: str | None = None):
        self.registry, self.clients, self.picker = registry, clients, picker
        self.headers = {"authorization": f"Bearer {instance_api_key}"} if instance_api_key else {}
        self.block_size = 0  # 0 until an instance has said
        self.following: set[str] = set()  # urls whose stream is open and has sent its first event
        self._streams: dict[str, tuple[Instance, asyncio.Task]] = {}  # url -> the instance followed, its stream

    def hashing_block_size(self) -> int:
        return self.block_size or DEFAULT_BLOCK_SIZE

    async def run(self) -> None:
        try:
            while True:
                self.sync()
                await asyncio.sleep(SYNC_INTERVAL_S)
        finally:
            tasks = [task for _, task in self._streams.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def sync(self) -> None:
        """A stream for each known instance, none for those gone; a new one for an instance that left and came back
        under its URL (its first event replaces what the picker remembered, which the new instance reset)."""
        known = {i.url: i for i in self.registry.all()}
        for url in [url for url, (instance, _) in self._streams.items() if known.get(url) is not instance]:
            self._streams.pop(url)[1].cancel()
            self.following.discard(url)
        for url in known.keys() - self._streams.keys():
            self._streams[url] = (known[url], asyncio.create_task(self._follow(url)))

    async def _follow(self, url: str) -> None:
        wait_s = RETRY_S
        while True:
            try:
                if await self._stream(url):
                    wait_s = RETRY_S
            except (httpx.HTTPError, ValueError) as e:
                log.debug("KV events of %s: %r", url, e)
            except Exception:  # never: a stream that silently stopped would leave that instance's view stale
                log.exception("following the KV events of %s failed; trying again", url)
            self.following.discard(url)
            await asyncio.sleep(wait_s)
            wait_s = min(MAX_RETRY_S, wait_s * 2)

    async def _stream(self, url: str) -> bool:
        """Follows one stream until it ends; whether it sent anything."""
        instance = self.registry.get(url)
        if instance is None:
            return False
        async with self.clients.of(url).stream("GET", url + PATH, headers=self.headers,
                                               timeout=httpx.Timeout(5.0, read=3 * PING_S)) as response:
            if response.status_code != 200:
                log.info("GET %s%s answered %d; trying again later", url, PATH, response.status_code)
                return False
            first = True
            async for line in _bounded_lines(response):
                if not line.startswith(b"data: "):
                    continue
                batch = json.loads(line[6:])
                if self.registry.get(url) is not instance:
                    return True  # it left and came back: a new stream starts from its whole set again
                events = batch.get("events") if isinstance(batch, dict) else None
                if not isinstance(events, list):
                    raise ValueError("a KV event batch without events")
                if first:
                    self._first(url, batch)
                    first = False
                self.picker.apply_events(instance, events)
            return not first

    def _first(self, url: str, batch: dict) -> None:
        size, blocks = batch.get("block_size"), batch.get("num_blocks")
        if not (isinstance(size, int) and isinstance(blocks, int) and size > 0 and blocks >= 0):
            raise ValueError("a KV event stream that does not start with its block size and count")
        if not self.block_size:
            self.block_size = size
        elif size != self.block_size:
            log.warning("%s caches blocks of %d tokens, other instances of %d: its prefixes will not match",
                        url, size, self.block_size)
        self.picker.follow(self.registry.get(url), blocks)
        self.following.add(url)


async def _bounded_lines(response: httpx.Response):
    pending = bytearray()
    async for chunk in response.aiter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield bytes(pending)
            pending.clear()
            start = end + 1
        pending += chunk[start:]
        if len(pending) > MAX_LINE_BYTES:
            raise ValueError(f"a KV event larger than {MAX_LINE_BYTES} bytes")
