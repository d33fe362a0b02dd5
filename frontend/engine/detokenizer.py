"""Streaming detokenisation: turn output tokens, a few at a time, into text deltas.

Decoding token by token is wrong twice over: a character can span several byte-level tokens, and
some decoders change a token's text depending on what precedes it. So we keep a small window:
`prefix` tokens whose text has already been emitted, followed by the not-yet-emitted tokens. Each
step decodes the window and emits whatever lies beyond the prefix's text, unless the window ends
in U+FFFD (an incomplete UTF-8 sequence), in which case we wait for more tokens.

The deltas concatenate to exactly `tokenizer.decode(output_ids)`.
"""
from __future__ import annotations

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        # The prompt is deliberately not used as decoding context: the contract is that the streamed
        # text equals decode(output ids), and with SentencePiece-style decoders a prompt prefix would
        # change how the first output token is spelled (its leading space).
        self.tokenizer = tokenizer
        self.prompt_token_ids = prompt_token_ids
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens before this have had their text emitted
        self.text = ""  # everything emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (possibly "")."""
        self.token_ids.extend(new_token_ids)
        if len(self.token_ids) == self.read_offset:
            return ""
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        window_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(window_text) <= len(prefix_text) or window_text.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or the last character is still incomplete
        if window_text.startswith(prefix_text):
            delta = window_text[len(prefix_text):]
        else:  # a decoder that is not prefix-stable: fall back to the (slower) full decode
            delta = self._decode(self.token_ids)[len(self.text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit whatever was held back, incomplete characters included."""
        delta = self._decode(self.token_ids)[len(self.text):]  # one full decode per request: cheap
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.text += delta
        return delta
