"""A reasoning model's thinking apart from its answer (`--reasoning-parser`): the text between `<think>` and
`</think>` becomes `reasoning_content` (and `reasoning`, vLLM's newer name), the rest `content`.

- qwen3: thinking only where the reply opens a think block (or the prompt did); a reply that never opens one is all
  answer. Qwen3's template with `enable_thinking: false` ends the prompt with an empty, closed block, so then every
  word is content (vLLM #19839 was the bug where it was not).
- deepseek_r1: DeepSeek-R1 thinks first whether or not its reply opens the block (its newer templates open it in
  the prompt), so everything before `</think>` is thinking; a reply that never closes it is all thinking.

Without `--reasoning-parser` the parser follows the model's chat template: one that writes `<think>` gets qwen3 where
it knows `enable_thinking`, deepseek_r1 otherwise, either taking thinking only where the prompt or the reply opens
a block (as llama.cpp does); `none` keeps the tags in the content.
The split runs on the detokenized text as it streams, so a tag split across chunks (`</th` + `ink>`) is held back
until it is whole; whitespace between the closing tag and the answer is dropped.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

REASONING_PARSERS = ("qwen3", "deepseek_r1", "none")


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    thinks_first: bool  # deepseek_r1: the reply is thinking until the closing tag, opened or not
    start: str = "<think>"
    end: str = "</think>"

    def opened_by(self, prompt: str) -> bool:
        """Whether the rendered prompt leaves a think block open for the reply (DeepSeek-R1's and Qwen3-Thinking's
        templates end with `<think>`)."""
        return prompt.rstrip().endswith(self.start)

    def closed_by(self, prompt: str) -> bool:
        """Whether the rendered prompt ends with a closed think block: the reply is all answer (Qwen3's template with
        enable_thinking false)."""
        return prompt.rstrip().endswith(self.end)


def reasoning_format(parser: str | None, chat_template: str | None) -> ReasoningFormat | None:
    """The format `--reasoning-parser` names; None (the flag not given): the one the chat template implies, which
    takes thinking only where the prompt or the reply opens it (a template may mention `<think>` only to drop past
    turns' thinking, for a model that answers at once: its replies must stay content)."""
    if parser is None:
        if not chat_template or "<think>" not in chat_template:
            return None
        return ReasoningFormat("qwen3" if "enable_thinking" in chat_template else "deepseek_r1", thinks_first=False)
    if parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {parser!r} (choose from {', '.join(REASONING_PARSERS)})")
    return None if parser == "none" else ReasoningFormat(parser, thinks_first=parser == "deepseek_r1")


def _held_back(text: str, tag: str) -> int:
    """Characters at the end of `text` that begin `tag` (it may be completed by the next chunk)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningText:
    """One choice's text split as it arrives: feed(chunk) -> (thinking, answer) to show now; finish() -> the rest."""

    def __init__(self, fmt: ReasoningFormat, opened: bool):
        self.fmt = fmt
        self.state = "thinking" if opened else "start"  # start -> thinking -> after -> answer, or start -> answer
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        thinking, answer, fmt = [], [], self.fmt
        self.pending += text
        while self.pending:
            if self.state == "start":
                head = self.pending.lstrip()
                if head.startswith(fmt.start):
                    self.state, self.pending = "thinking", head[len(fmt.start):]
                elif fmt.start.startswith(head):
                    break  # whitespace, or the opening tag's beginning
                else:
                    self.state = "thinking" if fmt.thinks_first else "answer"
            elif self.state == "thinking":
                end = self.pending.find(fmt.end)
                if end >= 0:
                    thinking.append(self.pending[:end])
                    self.state, self.pending = "after", self.pending[end + len(fmt.end):]
                    continue
                keep = _held_back(self.pending, fmt.end)
                thinking.append(self.pending[:len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep:]
                break
            elif self.state == "after":
                self.pending = self.pending.lstrip()
                if self.pending:
                    self.state = "answer"
            else:
                answer.append(self.pending)
                self.pending = ""
        return "".join(thinking), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """What was held back, once the choice has ended: a tag that never completed is text."""
        rest, self.pending = self.pending, ""
        if self.state == "thinking":
            return rest, ""
        if self.state == "start" and self.fmt.thinks_first and rest.strip():
            return rest, ""
        return "", rest if self.state != "after" else ""


async def with_reasoning(deltas: AsyncIterator, n: int, fmt: ReasoningFormat, opened: bool) -> AsyncIterator:
    """Streamed TextDeltas (frontend/api/serving.py) with each choice's thinking moved from `text` to
    `reasoning`; a delta left with neither (a tag held back) is skipped unless it ends its choice."""
    splitters = [ReasoningText(fmt, opened) for _ in range(n)]
    async with aclosing(deltas):
        async for delta in deltas:
            splitter = splitters[delta.index]
            thinking, answer = splitter.feed(delta.text)
            if delta.finish_reason is not None:
                more_thinking, more_answer = splitter.finish()
                thinking, answer = thinking + more_thinking, answer + more_answer
            delta.text, delta.reasoning = answer, thinking
            if answer or thinking or delta.finish_reason is not None or delta.logprobs:
                yield delta
