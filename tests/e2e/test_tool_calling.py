"""Tool calling through the real server (the tiny random model with the real SmolLM2 tokenizer and template, which
knows no tools: they go in a system message). Whatever the random model prefers, tool_choice "required" and a named
function make every reply a call whose arguments validate against the function's schema; the official `openai`
client's two-turn loop, LangChain's bind_tools loop and the `ollama` client's tools run unmodified."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import langchain_openai
import ollama
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S

MAX_TOKENS = 80  # a call with these bounded schemas takes at most ~40; the prompt (tools included) fits the rest
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
PROMPTS = [f"{q} (question {i})" for i, q in enumerate(["What is the weather in Oslo?", "Add 3 and 4.",
                                                        "Is it cold in Lima?", "What is 12 plus 30?"] * 5)]


def assert_valid(call) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_required_calls_parse_and_validate_for_20_prompts(client):
    def ask(i_prompt):
        i, prompt = i_prompt
        return client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
                                              tools=[WEATHER, ADD], tool_choice="required", max_tokens=MAX_TOKENS,
                                              seed=i, parallel_tool_calls=i % 2 == 0)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(ask, enumerate(PROMPTS)))
    for reply in replies:
        choice = reply.choices[0]
        # "length": the random model went on calling (parallel calls are allowed) until max_tokens; the complete
        # calls before the cut still parse. One call only: the grammar then allows nothing but the end.
        assert choice.finish_reason in ("tool_calls", "length") and choice.message.tool_calls, choice
        if replies.index(reply) % 2:
            assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            assert_valid(call)


def test_a_named_function_streamed_is_one_call_of_it(client):
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": PROMPTS[1]}], tools=[WEATHER, ADD], stream=True,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=MAX_TOKENS, seed=1)
    parts, finish = [], None
    for chunk in stream:
        parts += chunk.choices[0].delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(parts) == 1 and parts[0].function.name == "add"
    assert_valid(parts[0])


def test_the_openai_two_turn_tool_loop(client):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER],
                                           tool_choice="required", max_tokens=MAX_TOKENS, seed=3)
    call = first.choices[0].message.tool_calls[0]
    arguments = assert_valid(call)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": f"{arguments['city']}: 4 degrees, rain"}]
    answer = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER], max_tokens=16,
                                            seed=3)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


def test_langchain_bind_tools_agent_loop(server):
    @tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    llm = langchain_openai.ChatOpenAI(model=MODEL_NAME, base_url=server.url + "/v1", api_key="unused",
                                      max_tokens=100, timeout=REQUEST_TIMEOUT_S, max_retries=0, seed=5)
    messages = [HumanMessage("What is 2 plus 3?")]
    ai = llm.bind_tools([add], tool_choice="required").invoke(messages)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "add"
    messages += [ai] + [ToolMessage(str(add.invoke(c["args"])), tool_call_id=c["id"]) for c in ai.tool_calls]
    final = llm.bind_tools([add]).invoke(messages)
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")


def test_ollama_client_chat_with_tools_and_a_tool_result(server):
    client = ollama.Client(host=server.url, timeout=REQUEST_TIMEOUT_S)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    reply = client.chat(model=MODEL_NAME, messages=messages, tools=[WEATHER], options={"num_predict": 16, "seed": 1})
    assert reply.done and reply.message.role == "assistant"
    for call in reply.message.tool_calls or []:  # the random model rarely writes a call; any it writes must parse
        assert isinstance(call.function.arguments, dict)
    messages += [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
        {"role": "tool", "content": "4 degrees, rain", "tool_name": "get_weather"}]
    answer = client.chat(model=MODEL_NAME, messages=messages, tools=[WEATHER], options={"num_predict": 16, "seed": 1})
    assert answer.done and answer.prompt_eval_count > reply.prompt_eval_count
