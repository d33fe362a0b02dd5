"""`--discover-dns NAME:PORT` (and its per-role kin): every address NAME resolves to is an instance http://ADDRESS:PORT.

Made for a Kubernetes headless Service, whose name resolves to the ready pods' IPs (only ready ones: the Service
publishes an address once the pod's readiness probe, e.g. on /health, passes, and withdraws it when the pod stops).
"""
import asyncio
import socket


def parse_target(text: str) -> tuple[str, int]:
    """'NAME:PORT' -> (NAME, PORT); ValueError otherwise."""
    name, sep, port = text.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not NAME:PORT (e.g. tinyvllm.default.svc.cluster.local:8000)")
    return name.strip("[]"), int(port)


def instance_url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


async def resolve_instances(name: str, port: int) -> set[str]:
    """The instance URLs NAME resolves to now; socket.gaierror if it does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return {instance_url(sockaddr[0], port) for _, _, _, _, sockaddr in infos}
