"""Simulated `tinyvllm serve` instances for benchmarks/fleet_sim.py: many in one process, each on its own 127.0.0.1
port, speaking what `tinyvllm router` needs: GET /health, GET /metrics (vLLM's running/waiting/KV gauges) and
POST /v1/chat/completions, streamed (SSE) or whole.

Each instance is a scheduler in miniature: at most MAX_NUM_SEQS running, the rest waiting in arrival order; each step
spends a budget of MAX_BATCHED_TOKENS (one token per decoding request, then prompt chunks) and lasts what a tinyvllm
worker's step of that many tokens measured on an NVIDIA H200 (docs/BENCHMARKS.md, "On a GPU: NVIDIA H200": 2.6 /
10.9 / 17.6 / 42.6 ms at 1 / 16 / 64 / 256 tokens, piecewise linear between, linear beyond), divided by --speedup.
A prompt is prefilled past its longest cached prefix: an LRU per instance of the prompt's chunk hashes (the router's
own, frontend/router/prompt_chunks.py: 64 characters ~ one 16-token block), as large as --cache-blocks.

Each answer names its instance (header `x-sim-instance`) and ends with a `sim` record: the instance, when it got the
request (time.monotonic(), one clock for every process of the machine), its own time to first token and to the end,
prompt and cached tokens. A control port per process answers POST /kill/<k> (its k-th instance stops listening and
cuts its connections, as a killed process would) and GET /report (every instance's counters and the request ids it
received, with when).

    python benchmarks/fleet_instance.py --count 256          # prints {"control": PORT, "ports": [...]} then serves
"""
import argparse
import asyncio
import json
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import uvloop

from tinyvllm.frontend.router.prompt_chunks import CHUNK_CHARS, chunk_hashes, prompt_text

# The rest of a real server's page, about as long (~16 KB: its latency histograms), so the router's scrapes cost
# what they cost against tinyvllm serve
HISTOGRAMS = "".join(
    f"# TYPE vllm:{name} histogram\n" + "".join(f'vllm:{name}_bucket{{engine="0",le="{le}",model_name="sim"}} 0.0\n'
                                                for le in [*(f"{2 ** i / 1000:g}" for i in range(16)), "+Inf"])
    + f'vllm:{name}_count{{engine="0",model_name="sim"}} 0.0\nvllm:{name}_sum{{engine="0",model_name="sim"}} 0.0\n'
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_prompt_tokens", "request_generation_tokens")).encode()

H200_STEP_MS = ((1, 2.6), (16, 10.9), (64, 17.6), (256, 42.6))  # tokens in the step -> ms (docs/BENCHMARKS.md)
CHARS_PER_TOKEN = 4
TOKENS_PER_CHUNK = CHUNK_CHARS // CHARS_PER_TOKEN
MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 64, 512  # tinyvllm serve's defaults
WORDS = ("lorem", "ipsum", "dolor", "amet", "sed", "elit", "nunc", "vitae", "magna", "porta")


def step_seconds(tokens: int, speedup: float) -> float:
    """A step of `tokens` tokens: piecewise linear through the measured points, the last segment extended."""
    segments = list(zip(H200_STEP_MS, H200_STEP_MS[1:]))
    (x0, y0), (x1, y1) = next((s for s in segments if tokens <= s[1][0]), segments[-1])
    return max(H200_STEP_MS[0][1], y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)) / 1000 / speedup


@dataclass(eq=False)
class SimRequest:
    request_id: str
    hashes: list[bytes]
    prompt_tokens: int
    max_tokens: int
    stream: bool
    writer: asyncio.StreamWriter
    received: float
    cached_tokens: int = 0
    prefill_left: int = 0
    generated: int = 0
    first_token_at: float | None = None
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def reply_text(self) -> str:
        seed = self.hashes[-1][0] if self.hashes else self.prompt_tokens
        return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(self.generated))


class PrefixCache:
    """The chunk hashes an instance holds, least recently used first."""

    def __init__(self, capacity: int):
        self.capacity, self._hashes = capacity, OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def match(self, hashes: list[bytes]) -> int:
        matched = 0
        for h in hashes:
            if h not in self._hashes:
                break
            self._hashes.move_to_end(h)
            matched += 1
        return matched

    def store(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self._hashes[h] = None
            self._hashes.move_to_end(h)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)


class SimInstance:
    def __init__(self, index: int, cache_blocks: int, speedup: float):
        self.index, self.speedup = index, speedup
        self.cache = PrefixCache(cache_blocks)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.received: list[tuple[str, float]] = []  # (request id, when)
        self.prompt_tokens = self.cached_tokens = 0
        self.connections: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.dead = False
        self._wake = asyncio.Event()
        self._engine = asyncio.create_task(self._run())

    async def listen(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]

    def kill(self) -> None:
        self.dead = True
        self.server.close()
        for writer in list(self.connections):
            writer.transport.abort()
        self._engine.cancel()
        for request in self.waiting + self.running:
            if not request.done.done():
                request.done.set_result(None)

    def metrics_text(self) -> bytes:
        gauges = {"num_requests_running": len(self.running), "num_requests_waiting": len(self.waiting),
                  "kv_cache_usage_perc": min(1.0, len(self.cache) / self.cache.capacity)}
        return "".join(f'# TYPE vllm:{name} gauge\nvllm:{name}{{engine="0"}} {value}\n'
                       for name, value in gauges.items()).encode() + HISTOGRAMS

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while not self.dead:
                request = await read_request(reader)
                if request is None:
                    break
                method, path, body = request
                if path == "/health":
                    writer.write(whole_response(200, b"", "text/plain"))
                elif path == "/metrics":
                    writer.write(whole_response(200, self.metrics_text(), "text/plain; version=0.0.4"))
                elif method == "POST" and path == "/v1/chat/completions":
                    await self._generate(json.loads(body), writer)
                else:
                    writer.write(whole_response(404, b'{"error": {"message": "not simulated"}}'))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _generate(self, body: dict, writer: asyncio.StreamWriter) -> None:
        received = time.monotonic()
        text = prompt_text(body)
        request = SimRequest(str(body.get("user", "")), chunk_hashes(text), max(1, len(text) // CHARS_PER_TOKEN),
                             int(body.get("max_tokens") or 16), bool(body.get("stream")), writer, received)
        self.received.append((request.request_id, received))
        if request.stream:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                         b"x-sim-instance: %d\r\n\r\n" % self.index)
        self.waiting.append(request)
        self._wake.set()
        await request.done
        if self.dead:
            return
        if request.stream:
            writer.write(chunk(b"data: " + json.dumps(self._last_chunk(request)).encode() + b"\n\ndata: [DONE]\n\n")
                         + b"0\r\n\r\n")
        else:
            writer.write(whole_response(200, json.dumps(self._whole_answer(request)).encode(),
                                        headers=b"x-sim-instance: %d\r\n" % self.index))

    async def _run(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            self._admit()
            decoding = [r for r in self.running if r.prefill_left == 0]
            budget = MAX_BATCHED_TOKENS - len(decoding)
            chunks = []
            for r in self.running:
                if r.prefill_left and budget > 0:
                    chunks.append((r, min(budget, r.prefill_left)))
                    budget -= chunks[-1][1]
            await asyncio.sleep(step_seconds(len(decoding) + sum(n for _, n in chunks), self.speedup))
            now = time.monotonic()
            for r, n in chunks:
                r.prefill_left -= n
                if r.prefill_left == 0:
                    self.cache.store(r.hashes)
                    decoding.append(r)  # the step that ends a prompt samples its first token
            for r in decoding:
                self._token(r, now)
            self.running = [r for r in self.running if not r.done.done()]

    def _admit(self) -> None:
        while self.waiting and len(self.running) < MAX_NUM_SEQS:
            r = self.waiting.pop(0)
            r.cached_tokens = min(self.cache.match(r.hashes) * TOKENS_PER_CHUNK, r.prompt_tokens - 1)
            r.prefill_left = r.prompt_tokens - r.cached_tokens
            self.prompt_tokens += r.prompt_tokens
            self.cached_tokens += r.cached_tokens
            self.running.append(r)

    def _token(self, r: SimRequest, now: float) -> None:
        if r.first_token_at is None:
            r.first_token_at = now
        r.generated += 1
        if r.stream:
            delta = {"content": (" " if r.generated > 1 else "") + WORDS[r.generated % len(WORDS)]}
            event = {"id": r.request_id, "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            try:
                r.writer.write(chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
            except (ConnectionError, RuntimeError):
                pass
        if r.generated >= r.max_tokens:
            r.done.set_result(None)

    def _record(self, r: SimRequest) -> dict:
        now = time.monotonic()
        return {"instance": self.index, "received": r.received, "ttft_s": r.first_token_at - r.received,
                "service_s": now - r.received, "text": r.reply_text()}

    def _usage(self, r: SimRequest) -> dict:
        return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.generated,
                "total_tokens": r.prompt_tokens + r.generated,
                "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}

    def _last_chunk(self, r: SimRequest) -> dict:
        return {"id": r.request_id, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": self._usage(r),
                "sim": self._record(r)}

    def _whole_answer(self, r: SimRequest) -> dict:
        return {"id": r.request_id, "object": "chat.completion", "usage": self._usage(r), "sim": self._record(r),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.reply_text()},
                             "finish_reason": "length"}]}

    def report(self) -> dict:
        return {"index": self.index, "port": self.port, "dead": self.dead, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "received": self.received}


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    """(method, path, body) of the next request on a keep-alive connection; None once the peer closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return method, target.split("?", 1)[0], await reader.readexactly(length) if length else b""


def whole_response(status: int, body: bytes, content_type: str = "application/json", headers: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (status, content_type.encode(), len(body))
            + headers + b"\r\n" + body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve_control(instances: list[SimInstance], reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
    try:
        while (request := await read_request(reader)) is not None:
            method, path, _ = request
            if method == "POST" and path.startswith("/kill/"):
                instances[int(path.removeprefix("/kill/"))].kill()
                writer.write(whole_response(200, b"{}"))
            elif path == "/report":
                writer.write(whole_response(200, json.dumps([i.report() for i in instances]).encode()))
            else:
                writer.write(whole_response(404, b"{}"))
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(count: int, first_index: int, cache_blocks: int, speedup: float) -> None:
    instances = [SimInstance(first_index + i, cache_blocks, speedup) for i in range(count)]
    await asyncio.gather(*(i.listen() for i in instances))
    control = await asyncio.start_server(lambda r, w: serve_control(instances, r, w), "127.0.0.1", 0)
    print(json.dumps({"control": control.sockets[0].getsockname()[1], "ports": [i.port for i in instances]}),
          flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    for instance in instances:
        instance.kill()
    await asyncio.sleep(0.1)  # the connections' handlers see their connections cut and end


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=32, help="instances in this process")
    parser.add_argument("--first-index", type=int, default=0, help="the first instance's number (in x-sim-instance)")
    parser.add_argument("--cache-blocks", type=int, default=4096, help="prefix-cache blocks (chunks) per instance")
    parser.add_argument("--speedup", type=float, default=1.0, help="divides every step's time")
    args = parser.parse_args()
    uvloop.run(main(args.count, args.first_index, args.cache_blocks, args.speedup))
