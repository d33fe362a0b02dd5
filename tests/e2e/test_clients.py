"""Real client libraries against the real server: the official `openai` client (completion, chat, streamed chat,
model list, errors) and LangChain's ChatOpenAI (invoke and stream)."""
import langchain_openai
import openai
import pytest

from tests.e2e.http_helpers import chat_body, complete
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S

PROMPT = "Write a haiku about the sea."
MAX_TOKENS = 8


def reference_chat(server) -> str:
    """The same chat request through plain HTTP, for comparison."""
    text, _ = complete(server.url, "/v1/chat/completions", chat_body(PROMPT, max_tokens=MAX_TOKENS, temperature=0))
    return text


def test_openai_models_and_completion(client):
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    c = client.completions.create(model=MODEL_NAME, prompt="The capital of France is", max_tokens=MAX_TOKENS,
                                  temperature=0)
    assert c.object == "text_completion" and c.model == MODEL_NAME
    assert c.choices[0].text and c.choices[0].finish_reason in ("length", "stop")
    assert c.usage.completion_tokens <= MAX_TOKENS and c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_openai_chat_and_streamed_chat(client, server):
    messages = [{"role": "user", "content": PROMPT}]
    c = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert c.object == "chat.completion" and c.choices[0].message.role == "assistant"
    text = c.choices[0].message.content
    assert text and text == reference_chat(server)
    assert c.usage.completion_tokens == MAX_TOKENS or c.choices[0].finish_reason == "stop"

    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text and finish == c.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == c.usage.completion_tokens


def test_openai_errors_are_typed(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    assert e.value.status_code == 400 and "max_tokens" in str(e.value)


def test_langchain_chat_openai_invoke_and_stream(server):
    llm = langchain_openai.ChatOpenAI(model=MODEL_NAME, base_url=server.url + "/v1", api_key="unused",
                                      temperature=0, max_tokens=MAX_TOKENS, timeout=REQUEST_TIMEOUT_S,
                                      max_retries=0)
    expected = reference_chat(server)
    reply = llm.invoke(PROMPT)
    assert reply.content == expected
    chunks = list(llm.stream(PROMPT))
    assert len(chunks) > 1 and "".join(c.content for c in chunks) == expected
