"""OpenAI logprobs bodies from the worker's TokenLogprobs, shaped as vLLM returns them.

Chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; the top_logprobs
             dict holds the chosen token and the top k (so k or k + 1 entries). An echoed prompt's first token
             has no logprob: null in token_logprobs and top_logprobs.
A token's text is the token decoded alone (special tokens spelled out); its bytes are the token's own bytes, so
a character split across byte-level tokens stays recoverable even though each piece alone decodes to U+FFFD.
"""
import functools
import re

from tinyvllm.protocol.messages import TokenLogprobs

MIN_LOGPROB = -9999.0  # -inf is not JSON: OpenAI and vLLM send this floor instead
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, inverted: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {chr(b if b in printable else next(extra)): b for b in range(256)}


class TokenText:
    """Token id -> (text, bytes), cached per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.of = functools.lru_cache(maxsize=1 << 16)(self._of)

    def _of(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text, list(self._raw_bytes(token_id, text))

    def _raw_bytes(self, token_id: int, text: str) -> bytes:
        piece = getattr(self.tokenizer, "id_to_token", lambda _: None)(token_id)
        if "\ufffd" in text and piece:
            if m := _BYTE_TOKEN.fullmatch(piece):
                return bytes([int(m.group(1), 16)])
            alphabet = _byte_level_alphabet()
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        return text.encode("utf-8", errors="replace")


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def chat_content(tokens: TokenText, entries: list[TokenLogprobs], top_k: int) -> list[dict]:
    def item(token_id: int, logprob: float) -> dict:
        text, raw = tokens.of(token_id)
        return {"token": text, "logprob": _clamp(logprob), "bytes": raw}

    return [{**item(e.token_id, e.logprob),
             "top_logprobs": [item(t, lp) for t, lp in zip(e.top_token_ids[:top_k], e.top_logprobs[:top_k])]}
            for e in entries]


def completion_logprobs(tokens: TokenText, token_ids: list[int], entries: list[TokenLogprobs | None], top_k: int,
                        text_offset: int) -> dict:
    """The legacy body for consecutive tokens, the first at text_offset. As vLLM, offsets add up the tokens' own
    texts (so an echoed BOS counts), and a streamed choice's chunks continue where the previous one ended."""
    body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in zip(token_ids, entries):
        text = tokens.of(token_id)[0]
        body["tokens"].append(text)
        body["text_offset"].append(text_offset)
        text_offset += len(text)
        if entry is None:
            body["token_logprobs"].append(None)
            body["top_logprobs"].append(None)
            continue
        body["token_logprobs"].append(_clamp(entry.logprob))
        top = {text: _clamp(entry.logprob)}
        for t, lp in zip(entry.top_token_ids[:top_k], entry.top_logprobs[:top_k]):
            top.setdefault(tokens.of(t)[0], _clamp(lp))
        body["top_logprobs"].append(top)
    return body


def merge(first: dict | None, second: dict | None) -> dict | None:
    """Two consecutive bodies of the same format as one (None is empty)."""
    if first is None or second is None:
        return first if second is None else second
    return {key: first[key] + second[key] for key in first}


class ChoiceLogprobs:
    """One choice's logprobs as its outputs arrive, held until the text they belong to is sent."""

    def __init__(self, tokens: TokenText, is_chat: bool, top_k: int):
        self.tokens, self.is_chat, self.top_k = tokens, is_chat, top_k
        self.token_ids: list[int] = []
        self.entries: list[TokenLogprobs | None] = []
        self.text_offset = 0

    def add(self, token_ids: list[int], entries: list[TokenLogprobs | None] | None) -> None:
        entries = list(entries or [])
        self.token_ids += token_ids
        self.entries += entries + [None] * (len(token_ids) - len(entries))

    def take(self) -> dict:
        """The body for everything added since the last take."""
        ids, entries, self.token_ids, self.entries = self.token_ids, self.entries, [], []
        if self.is_chat:
            return {"content": chat_content(self.tokens, [e for e in entries if e is not None], self.top_k)}
        body = completion_logprobs(self.tokens, ids, entries, self.top_k, self.text_offset)
        self.text_offset += sum(len(t) for t in body["tokens"])
        return body
