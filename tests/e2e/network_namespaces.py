"""Machines for a test: Linux network namespaces (`ip netns`, root only) on one bridge.

The first namespace holds the bridge and the address 10.77.0.1; every other one is joined to it by a veth pair and
gets 10.77.0.2, .3, ... Each has its own loopback, so a server bound there is reachable only from inside (run a
client with `ip netns exec`). Names are unique per run; close() deletes the namespaces and with them every link.
"""
from __future__ import annotations

import subprocess
import uuid

SUBNET = "10.77.0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def cannot_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    name = f"tvcheck-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", name, "true"], check=True, capture_output=True, timeout=30)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    except subprocess.CalledProcessError as e:
        return f"`{' '.join(e.cmd)}` failed (root and CAP_SYS_ADMIN are needed): {e.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class Namespaces:
    def __init__(self, count: int):
        tag = uuid.uuid4().hex[:6]
        self.names = [f"tinyvllm-{tag}-{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str) -> None:
        hub, bridge = self.names[0], f"tvbr{tag}"
        for name in self.names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", hub, "link", "add", bridge, "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{self.addresses[0]}/24", "dev", bridge)
        _ip("-n", hub, "link", "set", bridge, "up")
        for i, name in enumerate(self.names[1:], 1):
            hub_end, far_end = f"tv{tag}h{i}", f"tv{tag}n{i}"
            _ip("link", "add", hub_end, "netns", hub, "type", "veth", "peer", "name", far_end, "netns", name)
            _ip("-n", hub, "link", "set", hub_end, "master", bridge, "up")
            _ip("-n", name, "addr", "add", f"{self.addresses[i]}/24", "dev", far_end)
            _ip("-n", name, "link", "set", far_end, "up")

    def exec_prefix(self, index: int) -> tuple[str, ...]:
        """Runs a command inside namespace `index` (ip execs it: the pid stays the command's)."""
        return ("ip", "netns", "exec", self.names[index])

    def close(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
