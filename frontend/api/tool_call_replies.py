"""Chat replies with tool calls (frontend/api/tool_calls.py): a finished choice's calls become message.tool_calls, and a
streamed reply's calls come in its last chunk (delta.tool_calls), after the content before them. A reply that called
tools finishes with "tool_calls" (unless it ran out of tokens)."""
from collections.abc import AsyncIterator
from contextlib import aclosing

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.serving import ChoiceResult, TextDelta
from tinyvllm.frontend.api.tool_calls import ToolCallText, parse_tool_calls


def _finish_reason(reason: str | None) -> str | None:
    return "tool_calls" if reason == "stop" else reason


def chat_choice(choice: ChoiceResult, parse_calls: bool) -> dict:
    content, calls = parse_tool_calls(choice.text) if parse_calls else (choice.text, [])
    if not calls:
        return api.chat_choice(choice.index, choice.text, choice.finish_reason, choice.stop_reason, choice.logprobs,
                               reasoning=choice.reasoning)
    return api.chat_choice(choice.index, content or None, _finish_reason(choice.finish_reason), choice.stop_reason,
                           choice.logprobs, [call.openai() for call in calls], choice.reasoning)


async def with_tool_calls(deltas: AsyncIterator[TextDelta], n: int) -> AsyncIterator[TextDelta]:
    """deltas, each choice's calls taken out of its text and put on its last delta (TextDelta.tool_calls)."""
    texts = [ToolCallText() for _ in range(n)]
    async with aclosing(deltas):
        async for delta in deltas:
            delta.text = texts[delta.index].feed(delta.text)
            if delta.finish_reason is not None:
                rest, calls = texts[delta.index].finish()
                delta.text += rest
                if calls:
                    delta.tool_calls = [call.openai(i) for i, call in enumerate(calls)]
                    delta.finish_reason = _finish_reason(delta.finish_reason)
            if delta.text or delta.reasoning or delta.finish_reason is not None or delta.logprobs:
                yield delta
