"""Who may join an engine: a secret shared by the scheduler and its workers, proved both ways at the handshake.

Mutual HMAC-SHA256 challenge-response on the worker socket (scheduler/worker_admission.py, workers/scheduler_join.py):
  worker -> WorkerHello{..., nonce Nw}
  scheduler -> SchedulerChallenge{Ns, HMAC(secret, "scheduler" | Nw | Ns)}    the worker checks it: a real scheduler
  worker -> WorkerProof{HMAC(secret, "worker" | Ns | Nw | the hello's bytes)}  the scheduler checks it, then the hello
  scheduler -> InitWorker once every worker is in, or WorkerRefused{reason}
A worker that finds the scheduler's proof wrong answers with an empty proof (so the scheduler's log says why) and
exits. The labels keep one side's answer from ever serving as the other's; fresh nonces stop replays; binding the
hello's bytes keeps its claims (rank, model, stage address) from being swapped. Only HMACs of random nonces cross
the wire, never the secret. The scheduler ignores every later message from a ZMQ identity that did not finish this.
Each pipeline stage's input (workers/stage_link.py) takes only messages sealed with a key derived from the same
secret, the scheduler's session (group id) and the receiving rank, numbered so none can be replayed or reordered.
Nothing is encrypted, and an attacker inside the network path could relay a handshake: the secret keeps strangers
out, as the project's rule asks; run across untrusted networks only inside a VPN.
Without a secret (ipc://, or tcp on loopback) the same exchange runs with an empty key, which proves nothing.
"""
import hashlib
import hmac
import ipaddress
import secrets

SECRET_ENV = "TINYVLLM_WORKER_SECRET"
MIN_SECRET_CHARS = 16
NONCE_BYTES = 32


def resolve_secret(flag: str | None, environ, env_name: str, what: str) -> str:
    """The flag wins over the environment variable; "" means none. A short secret is refused."""
    secret = flag if flag is not None else environ.get(env_name, "")
    if secret and len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"the {what} is too short: at least {MIN_SECRET_CHARS} characters "
                         f"(e.g. `openssl rand -hex 32`)")
    return secret


def resolve_worker_secret(flag: str | None, environ) -> str:
    """--worker-secret wins over $TINYVLLM_WORKER_SECRET; "" means none. A short secret is refused."""
    return resolve_secret(flag, environ, SECRET_ENV, "worker secret")


def is_loopback(address: str) -> bool:
    """True for ipc:// and for tcp:// on 127.0.0.0/8, ::1 or localhost: nothing off this machine reaches it."""
    if not address.startswith("tcp://"):
        return address.startswith(("ipc://", "inproc://"))
    host = address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or an interface: assume the network reaches it


def require_secret_beyond_loopback(secret: str, **addresses: str) -> None:
    """Raises ValueError naming the first address (by its flag) that other machines reach while there is no secret."""
    for flag, address in addresses.items():
        if address and not secret and not is_loopback(address):
            raise ValueError(f"--{flag.replace('_', '-')} {address} is reachable from other machines: set a shared "
                             f"secret in {SECRET_ENV} (or --worker-secret), the same for the scheduler and every "
                             f"worker, e.g. `export {SECRET_ENV}=$(openssl rand -hex 32)`")


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(secret: str, *parts: bytes) -> bytes:
    return hmac.digest(secret.encode(), b"\0".join(parts), hashlib.sha256)


def scheduler_proof(secret: str, worker_nonce: bytes, scheduler_nonce: bytes) -> bytes:
    return _mac(secret, b"tinyvllm scheduler", worker_nonce, scheduler_nonce)


def worker_proof(secret: str, scheduler_nonce: bytes, worker_nonce: bytes, hello: bytes) -> bytes:
    return _mac(secret, b"tinyvllm worker", scheduler_nonce, worker_nonce, hello)


def proof_matches(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def stage_link_key(secret: str, group_id: str, receiving_rank: int) -> bytes:
    """The key sealing what flows into `receiving_rank`'s stage input during one scheduler session."""
    return _mac(secret, b"tinyvllm stage link", group_id.encode(), str(receiving_rank).encode())


def seal(key: bytes, *frames: bytes) -> bytes:
    return hmac.digest(key, b"".join(hashlib.sha256(f).digest() for f in frames), hashlib.sha256)
