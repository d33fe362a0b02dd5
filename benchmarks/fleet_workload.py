"""The clients of benchmarks/fleet_sim.py: multi-turn chats sharing system prompts, each client on its own keep-alive
connection to one router replica, and what each request's answer was (fleet_sim.py's docstring has the workload)."""
import asyncio
import json
import random
import time
from dataclasses import dataclass

REQUEST_TIMEOUT_S = 120.0


@dataclass
class Answer:
    request_id: str
    sent: float
    ended: float = 0.0
    first_byte: float | None = None
    status: int = 0
    instance: int | None = None
    record: dict | None = None  # the instance's `sim` record
    error: str | None = None



class RouterConnection:
    """One client's keep-alive HTTP/1.1 connection to a router (a few lines of HTTP, so that the client's own CPU
    leaves the machine to the router)."""

    def __init__(self, port: int):
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, answer: Answer) -> bytes:
        """The answer's body; status and first byte's time go into `answer`."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            self._writer.write(b"POST %s HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
                               b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
            head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            answer.status = int(head[0].split(" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
            if "x-sim-instance" in headers:
                answer.instance = int(headers["x-sim-instance"])
            if headers.get("transfer-encoding") == "chunked":
                parts = []
                while size := int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    parts.append((await self._reader.readexactly(size + 2))[:-2])
                    answer.first_byte = answer.first_byte or time.monotonic()
                await self._reader.readuntil(b"\r\n")
                data = b"".join(parts)
            else:
                data = await self._reader.readexactly(int(headers.get("content-length", 0)))
                answer.first_byte = time.monotonic()
            if headers.get("connection") == "close":
                self.close()
            return data
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def words(rng: random.Random, chars: int) -> str:
    text = []
    while sum(map(len, text)) < chars:
        text.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))))
    return " ".join(text)


class Workload:
    def __init__(self, config, router_ports: list[int]):
        """config: fleet_sim.FleetConfig (users, rate, turns, system_prompts, output_tokens, min_requests, seed)."""
        self.config, self.router_ports = config, router_ports
        rng = random.Random(config.seed)
        self.system_prompts = [f"You are assistant number {k}. " + words(rng, 2000)
                               for k in range(config.system_prompts)]
        self.answers: list[Answer] = []
        self._sent = 0
        self._next_slot = 0.0
        self._answered = 0
        self.end = 0.0

    async def run(self, duration_s: float) -> None:
        self.end = time.monotonic() + duration_s
        self._next_slot = time.monotonic()
        await asyncio.gather(*(self._user(u) for u in range(self.config.users)))

    async def _paced(self) -> None:
        if self.config.rate:
            self._next_slot = max(self._next_slot + 1 / self.config.rate, time.monotonic())
            await asyncio.sleep(self._next_slot - time.monotonic())

    async def _user(self, u: int) -> None:
        c, rng = self.config, random.Random(f"{self.config.seed}-{u}")
        connection = RouterConnection(self.router_ports[u % len(self.router_ports)])
        try:
            while not self._over():
                messages = [{"role": "system", "content": rng.choice(self.system_prompts)}]
                for turn in range(c.turns):
                    messages.append({"role": "user", "content": f"User {u}, turn {turn}: " + words(rng, 300)})
                    await self._paced()
                    if self._over():
                        return
                    reply = await self._ask(connection, messages)
                    if reply is None:
                        break
                    messages.append({"role": "assistant", "content": reply})
        finally:
            connection.close()

    def _over(self) -> bool:
        return time.monotonic() >= self.end and self._answered >= self.config.min_requests

    async def _ask(self, connection: RouterConnection, messages: list[dict]) -> str | None:
        self._sent += 1
        request_id = f"r{self._sent}"
        body = json.dumps({"model": "sim", "messages": messages, "max_tokens": self.config.output_tokens,
                           "stream": True, "user": request_id}).encode()
        answer = Answer(request_id, time.monotonic())
        self.answers.append(answer)
        try:
            data = await asyncio.wait_for(connection.post("/v1/chat/completions", body, answer), REQUEST_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as e:
            answer.ended, answer.error = time.monotonic(), repr(e)
            return None
        answer.ended = time.monotonic()
        events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
        last = json.loads(events[-2][6:]) if answer.status == 200 and len(events) >= 2 else {}
        if events[-1:] != [b"data: [DONE]"] or "sim" not in last:
            answer.error = f"{answer.status} {data[-300:]!r}"
            return None
        answer.record = last["sim"]
        self._answered += 1
        return last["sim"]["text"]
