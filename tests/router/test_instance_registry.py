"""InstanceRegistry with a hand-driven clock: registration and expiry, health checks, unreachable instances, drains
(no new requests, removal once the open ones finished, no way back while the drained instance keeps beating), DNS."""
from tinyvllm.frontend.router.instance_registry import (DNS, DRAINING, REGISTERED, ROUTABLE, STATIC, UNHEALTHY,
                                                        InstanceRegistry, Load)

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registry(**kwargs) -> tuple[InstanceRegistry, Clock]:
    clock = Clock()
    return InstanceRegistry(heartbeat_timeout_s=6.0, clock=clock, **kwargs), clock


def beat(reg: InstanceRegistry, url: str = A, **load) -> bool:
    return reg.heartbeat(url, "both", "tiny", Load(**load))


def urls(instances) -> list[str]:
    return sorted(i.url for i in instances)


def test_a_heartbeat_registers_and_refreshes_an_instance():
    reg, clock = registry()
    assert beat(reg, running=2, waiting=1, kv_usage=0.5)
    instance = reg.get(A)
    assert (instance.source, instance.model, instance.load) == (REGISTERED, "tiny", Load(2, 1, 0.5))
    assert urls(reg.routable()) == [A]
    clock.now += 5
    assert beat(reg, running=0)
    assert reg.get(A) is instance and instance.load.running == 0


def test_an_instance_without_heartbeats_stops_being_routable_at_the_timeout_and_is_swept():
    reg, clock = registry()
    beat(reg)
    clock.now += 6.0
    assert urls(reg.routable()) == [A]
    clock.now += 0.001
    assert reg.routable() == [] and reg.state(reg.get(A)) == UNHEALTHY  # before any sweep
    assert urls(reg.sweep()) == [A]
    assert reg.get(A) is None and len(reg) == 0
    assert beat(reg) and urls(reg.routable()) == [A]  # it may come back


def test_a_reported_drain_stops_routing_without_removing():
    reg, _ = registry()
    beat(reg, draining=True)
    assert reg.routable() == [] and reg.state(reg.get(A)) == DRAINING
    beat(reg, draining=False)
    assert urls(reg.routable()) == [A]


def test_static_instances_are_routable_once_a_health_check_passes():
    reg, clock = registry()
    reg.add(A, STATIC)
    assert reg.routable() == []
    reg.health_checked(A, True, Load(running=3))
    assert urls(reg.routable()) == [A] and reg.get(A).load.running == 3
    clock.now += 1000  # no heartbeats expected from a static instance
    assert urls(reg.routable()) == [A] and reg.sweep() == []
    reg.health_checked(A, False)
    assert reg.routable() == [] and reg.state(reg.get(A)) == UNHEALTHY


def test_a_failed_connection_makes_an_instance_unavailable_until_it_answers_again():
    reg, _ = registry()
    beat(reg)
    beat(reg, B)
    reg.unreachable(reg.get(A))
    assert urls(reg.routable()) == [B]
    beat(reg)
    assert urls(reg.routable()) == [A, B]


def test_a_drained_instance_takes_no_new_requests_and_leaves_once_its_requests_finished():
    reg, _ = registry()
    beat(reg)
    instance = reg.get(A)
    reg.opened(instance)
    reg.opened(instance)
    assert reg.drain(A)
    assert reg.routable() == [] and reg.state(instance) == DRAINING and reg.get(A) is instance
    reg.closed(instance)
    assert reg.get(A) is instance
    reg.closed(instance)
    assert reg.get(A) is None
    assert not reg.drain(B)  # unknown


def test_a_draining_instance_that_keeps_beating_is_not_expired_while_its_requests_run():
    reg, clock = registry()
    beat(reg)
    instance = reg.get(A)
    reg.opened(instance)
    reg.drain(A)
    for _ in range(10):
        clock.now += 2
        assert not beat(reg)  # told it is out...
        assert reg.sweep() == [] and reg.get(A) is instance  # ...but alive, so not expired
    reg.closed(instance)
    assert reg.get(A) is None


def test_an_idle_instance_leaves_at_once_when_drained():
    reg, _ = registry()
    beat(reg)
    reg.drain(A)
    assert reg.get(A) is None


def test_an_instance_an_operator_drained_is_refused_while_it_keeps_beating_then_forgotten():
    reg, clock = registry()
    beat(reg)
    reg.drain(A)
    for _ in range(10):
        clock.now += 2
        assert not beat(reg)
        reg.sweep()
    clock.now += 6.5  # quiet for longer than forget_after_s (the heartbeat timeout)
    reg.sweep()
    assert beat(reg) and urls(reg.routable()) == [A]


def test_a_deregistered_instance_may_come_back():
    reg, _ = registry()
    beat(reg)
    reg.drain(A, by_operator=False)
    assert reg.get(A) is None
    assert beat(reg)


def test_dns_addresses_join_and_vanished_ones_are_drained():
    reg, _ = registry()
    reg.sync_dns({A, B})
    assert {i.source for i in reg.all()} == {DNS} and reg.routable() == []
    reg.health_checked(A, True)
    reg.health_checked(B, True)
    b = reg.get(B)
    reg.opened(b)
    reg.sync_dns({A})
    assert urls(reg.routable()) == [A] and reg.state(b) == DRAINING
    reg.closed(b)
    assert urls(reg.all()) == [A]
    reg.sync_dns({A, B})  # back in DNS: a fresh instance, checked before it is routable
    assert reg.get(B) is not b and reg.state(reg.get(B)) == UNHEALTHY


def test_counts_and_listing():
    reg, clock = registry()
    beat(reg, running=1)
    reg.add(B, STATIC)
    clock.now += 1.5
    assert reg.counts_by_state() == {ROUTABLE: 1, DRAINING: 0, UNHEALTHY: 1}
    row = reg.describe(reg.get(A))
    assert row == {"url": A, "role": "both", "source": REGISTERED, "model": "tiny", "state": ROUTABLE,
                   "draining": False, "open_requests": 0, "load": {"running": 1, "waiting": 0, "kv_usage": 0.0},
                   "last_seen_s_ago": 1.5}
