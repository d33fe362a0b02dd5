"""Who the router may send requests to: the instances it knows, where each came from, and what state it is in.

Instances come from the command line (static), from DNS (dns) or by registering themselves with heartbeats
(registered). A registered instance is routable while its last heartbeat is younger than the heartbeat timeout;
a static or DNS one while its last health check passed. A failed connection makes any instance unavailable until
its next heartbeat or passing health check. An instance being drained (by an operator, by its own deregistration,
or gone from DNS) takes no new requests and leaves the list once the router's requests on it have finished; one an
operator drained is not let back in while it keeps announcing itself (until it has been quiet for
`forget_after_s`). Time comes from `clock`, so tests drive it by hand.
"""
import time
from collections.abc import Callable
from dataclasses import dataclass

STATIC, REGISTERED, DNS = "static", "registered", "dns"
ROUTABLE, DRAINING, UNHEALTHY = "routable", "draining", "unhealthy"
MAX_INSTANCES = 1024


@dataclass(slots=True)
class Load:
    """What an instance last reported: its engines' running and waiting requests and KV-cache usage."""
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    draining: bool = False


@dataclass(eq=False, slots=True)
class Instance:
    url: str
    source: str
    role: str = "both"
    model: str | None = None
    load: Load = None
    healthy: bool = False  # last heartbeat or health check passed, and no connection failed since
    leaving: bool = False  # drained by the router: no new requests; removed once `open` is 0
    last_seen: float | None = None  # the clock's time of its last heartbeat or passing health check
    open: int = 0  # requests the router has open on it

    def __post_init__(self):
        self.load = self.load or Load()

    @property
    def draining(self) -> bool:
        return self.leaving or self.load.draining


class InstanceRegistry:
    def __init__(self, heartbeat_timeout_s: float = 6.0, clock: Callable[[], float] = time.monotonic,
                 forget_after_s: float | None = None):
        self.heartbeat_timeout_s, self.clock = heartbeat_timeout_s, clock
        self.forget_after_s = heartbeat_timeout_s if forget_after_s is None else forget_after_s
        self._instances: dict[str, Instance] = {}
        self._drained: dict[str, float] = {}  # url an operator drained -> when it last announced itself

    def __len__(self) -> int:
        return len(self._instances)

    def get(self, url: str) -> Instance | None:
        return self._instances.get(url)

    def all(self) -> list[Instance]:
        return list(self._instances.values())

    def add(self, url: str, source: str, role: str = "both") -> Instance | None:
        """A static or DNS instance (not routable until a health check passes); None if it is refused."""
        if url in self._instances:
            return self._instances[url]
        if self._refused(url):
            return None
        self._instances[url] = instance = Instance(url, source, role)
        return instance

    def heartbeat(self, url: str, role: str, model: str, load: Load) -> bool:
        """Registers or refreshes an instance; False if it was refused (drained by an operator, or too many)."""
        instance = self._instances.get(url)
        if instance is None:
            if self._refused(url):
                return False
            self._instances[url] = instance = Instance(url, REGISTERED)
        instance.role, instance.model, instance.load = role, model, load
        instance.healthy, instance.last_seen = True, self.clock()
        return not instance.leaving  # a leaving one stays alive while its requests finish, but is told it is out

    def health_checked(self, url: str, healthy: bool, load: Load | None = None) -> None:
        if (instance := self._instances.get(url)) is None:
            return
        instance.healthy = healthy
        if healthy:
            instance.last_seen = self.clock()
        if load is not None:
            instance.load = load

    def unreachable(self, instance: Instance) -> None:
        """A connection to it failed: no requests until it answers again."""
        instance.healthy = False

    def drain(self, url: str, *, by_operator: bool = True) -> bool:
        """No new requests to it; it leaves once the router's open requests on it finish. False if unknown."""
        if (instance := self._instances.get(url)) is None:
            return False
        instance.leaving = True
        if by_operator:
            self._drained[url] = self.clock()
        self._remove_if_done(instance)
        return True

    def sync_dns(self, urls: set[str], role: str = "both") -> None:
        """The addresses of the DNS name for `role` now: new ones join with that role, those of the role gone are
        drained."""
        for url in urls:
            self.add(url, DNS, role)
        for instance in self.all():
            if instance.source == DNS and instance.role == role and instance.url not in urls:
                self.drain(instance.url, by_operator=False)

    def opened(self, instance: Instance) -> None:
        instance.open += 1

    def closed(self, instance: Instance) -> None:
        instance.open -= 1
        self._remove_if_done(instance)

    def state(self, instance: Instance) -> str:
        if instance.draining:
            return DRAINING
        return ROUTABLE if instance.healthy and not self._expired(instance) else UNHEALTHY

    def routable(self) -> list[Instance]:
        return [i for i in self._instances.values() if self.state(i) == ROUTABLE]

    def sweep(self) -> list[Instance]:
        """Removes registered instances whose heartbeats stopped, and forgets operator drains of instances that went
        quiet; returns the instances removed."""
        expired = [i for i in self._instances.values() if i.source == REGISTERED and self._expired(i)]
        for instance in expired:
            del self._instances[instance.url]
        now = self.clock()
        for url, seen in list(self._drained.items()):
            if now - seen > self.forget_after_s and url not in self._instances:
                del self._drained[url]
        return expired

    def _expired(self, instance: Instance) -> bool:
        return instance.source == REGISTERED and (
            instance.last_seen is None or self.clock() - instance.last_seen > self.heartbeat_timeout_s)

    def _refused(self, url: str) -> bool:
        if url in self._drained:
            self._drained[url] = self.clock()
            return True
        return len(self._instances) >= MAX_INSTANCES

    def _remove_if_done(self, instance: Instance) -> None:
        if instance.leaving and instance.open == 0 and self._instances.get(instance.url) is instance:
            del self._instances[instance.url]

    def counts_by_state(self) -> dict[str, int]:
        counts = {ROUTABLE: 0, DRAINING: 0, UNHEALTHY: 0}
        for instance in self._instances.values():
            counts[self.state(instance)] += 1
        return counts

    def describe(self, instance: Instance) -> dict:
        """One row of GET /instances."""
        seen = None if instance.last_seen is None else round(self.clock() - instance.last_seen, 3)
        return {"url": instance.url, "role": instance.role, "source": instance.source, "model": instance.model,
                "state": self.state(instance), "draining": instance.draining, "open_requests": instance.open,
                "load": {"running": instance.load.running, "waiting": instance.load.waiting,
                         "kv_usage": instance.load.kv_usage},
                "last_seen_s_ago": seen}
