"""A tokenizer with one token per character, for frontend tests that must not depend on a real model."""
SPECIAL = {0: "<pad>", 1: "<s>", 2: "</s>"}
OFFSET = 3  # token id = code point + OFFSET


class CharTokenizer:
    bos_token_id = 1
    eos_token_ids = [2]
    vocab_size = 0x110000 + OFFSET
    chat_template = None  # the source of a real template: none here, so tools go in a system message

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + [ord(c) + OFFSET for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(SPECIAL[i] if i in SPECIAL else chr(i - OFFSET)
                       for i in ids if not (skip_special_tokens and i in SPECIAL))

    def token_to_id(self, token: str) -> int | None:
        return ord(token) + OFFSET if len(token) == 1 else None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        out = []
        for m in messages:
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown role {m['role']!r}")
            out.append(f"<{m['role']}>{m['content']}\n")
        return "".join(out) + ("<assistant>" if add_generation_prompt else "")


class CharDetokenizer:
    """Same interface as frontend.detokenizer.IncrementalDetokenizer."""

    def __init__(self, tokenizer: CharTokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def add(self, new_token_ids: list[int]) -> str:
        return self.tokenizer.decode(new_token_ids, self.skip_special_tokens)

    def flush(self) -> str:
        return ""
