"""What crosses a socket stays safe to read: no pickle (or anything like it) anywhere in the package, every ZMQ socket
bounds its message size, ipc:// endpoints live in a folder only their user can enter, and tcp:// ones default to
loopback (beyond it, workers authenticate: tests/protocol/test_worker_auth.py)."""
import ast
import dataclasses
import os
import pathlib
import stat

import zmq

from tinyvllm.protocol.codec import MAX_MESSAGE_BYTES
from tinyvllm.protocol.transport import Endpoints, make_socket

PACKAGE = pathlib.Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("frontend", "scheduler", "workers", "protocol")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
UNSAFE_CALLS = {"recv_pyobj", "send_pyobj", "recv_serialized", "send_serialized", "loads_pickle"}


def unsafe_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in UNSAFE_CALLS:
            found.append(node.attr)
        elif isinstance(node, ast.keyword) and node.arg == "allow_pickle" and not (
                isinstance(node.value, ast.Constant) and node.value.value is False):
            found.append("allow_pickle")
    return found


# The one exception, and why: captured jitted steps are pickled (tinygrad's own form of them) into the user's own
# cache folder and read back from there only, after checking that nobody else owns or may write it, as tinygrad's
# kernel cache (CACHEDB) already does in every process. It must never touch a socket.
DISK_ONLY = {"workers/captured_steps.py": ["pickle"]}
NETWORK_MODULES = {"zmq", "socket", "httpx", "asyncio", "tinyvllm.protocol.transport"}


def test_nothing_in_the_package_can_unpickle():
    files = [p for folder in SOURCE_FOLDERS for p in (PACKAGE / folder).rglob("*.py")]
    assert len(files) > 50
    offenders = {str(p.relative_to(PACKAGE)): uses for p in files if (uses := unsafe_uses(ast.parse(p.read_text())))}
    assert offenders == DISK_ONLY


def test_the_disk_only_exception_reaches_no_network():
    for name in DISK_ONLY:
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
            {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m and m.split(".")[0] in NETWORK_MODULES or m in NETWORK_MODULES}, name


def test_the_check_would_see_a_pickle():
    assert unsafe_uses(ast.parse("import pickle\nfrom dill import loads\nsock.recv_pyobj()\nnp.load(f, allow_pickle=True)")) \
        == ["pickle", "dill", "recv_pyobj", "allow_pickle"]


def test_make_socket_bounds_the_message_size_of_every_socket_it_makes():
    ctx = zmq.Context()
    try:
        sock = make_socket(ctx, zmq.PULL, "inproc://bounded", bind=True)
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE_BYTES
        sock.close()
    finally:
        ctx.term()


def test_ipc_endpoints_live_in_a_private_folder_and_tcp_defaults_to_loopback():
    endpoints = Endpoints.ipc()
    folder = pathlib.Path(endpoints.scheduler_input[len("ipc://"):]).parent
    try:
        assert all(e.startswith(f"ipc://{folder}/") for e in dataclasses.astuple(endpoints))
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    finally:
        folder.rmdir()
    assert all(e.startswith("tcp://127.0.0.1:") for e in dataclasses.astuple(Endpoints.tcp()))
