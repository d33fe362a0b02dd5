"""A request's prompt as chained hashes of fixed-size chunks of its text, the router's prefix-cache keys.

The router has no tokenizer, so this is an approximation of the instances' prefix caches (which key full blocks of
token ids), in the spirit of SGLang's router and its character-level radix tree: two prompts sharing their first
k x CHUNK_CHARS characters share their first k hashes. The text is the request's `prompt` (completions, Ollama's
generate) or `messages` (chat, both APIs), with Ollama's `system` first; anything not a string is taken as its
compact JSON, whose prefixes still line up (a conversation that grows by a message keeps its earlier text).
"""
import hashlib
import json

CHUNK_CHARS = 64  # about one 16-token KV block of English text
MAX_CHUNKS = 4096  # 256 KiB of text: enough to tell prompts apart without hashing megabytes per request
_ROOT = b"tinyvllm router prompt"


def prompt_text(body) -> str:
    """The text a generation request's body asks the model to continue ("" when there is none)."""
    if not isinstance(body, dict):
        return ""
    parts = [body.get("system"), body.get("messages"), body.get("prompt")]
    return "".join(p if isinstance(p, str) else json.dumps(p, ensure_ascii=False, separators=(",", ":"))
                   for p in parts if p is not None)


def chunk_hashes(text: str, chunk_chars: int = CHUNK_CHARS) -> list[bytes]:
    """The chained hash of every full chunk of the text (a partial last chunk is left out, as a partial block)."""
    hashes, parent = [], _ROOT
    end = min(len(text), chunk_chars * MAX_CHUNKS)
    for start in range(0, end - chunk_chars + 1, chunk_chars):
        parent = hashlib.blake2b(parent + text[start:start + chunk_chars].encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()
        hashes.append(parent)
    return hashes


def request_chunk_hashes(raw_body: bytes) -> list[bytes]:
    """The prompt's chunk hashes of a JSON request body; [] for anything else (the instance will judge it)."""
    if not raw_body:
        return []
    try:
        body = json.loads(raw_body)
    except (ValueError, RecursionError):
        return []
    return chunk_hashes(prompt_text(body))
