"""Structured output through the real server on the tiny random model: whatever the model prefers, the grammar's
mask makes every output valid. JSON schemas (response_format, guided_json, Ollama's format), regex, choice, a
Lark grammar, json_object; broken ones are a 400 naming the problem; a plain request batched with constrained
ones samples exactly what it samples alone."""
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import ollama

from tests.e2e.http_helpers import assert_openai_error, chat_body, complete, completion_body
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S
from tinyvllm.protocol.tokenizer import Tokenizer

NUM_SCHEMAS = 50
MAX_TOKENS = 400  # far more than any of the schemas below needs


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A bounded schema: every array, string and number ends, so a complete value always fits MAX_TOKENS."""
    kinds = ["integer", "number", "enum", "string", "boolean"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        low = rng.uniform(-10, 10)
        return {"type": "number", "minimum": round(low, 2), "maximum": round(low + rng.uniform(0.5, 20), 2)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "cyan", 1, 2, None], rng.randint(1, 4))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 8)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": low,
                "maxItems": low + rng.randint(0, 2)}
    return random_object(rng, depth)


def random_object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(["id", "name", "size", "tags", "owner", "price", "kind", "ok"], rng.randint(1, 4))
    properties = {n: random_schema(rng, depth + 1) for n in names}
    return {"type": "object", "properties": properties, "required": rng.sample(names, rng.randint(1, len(names))),
            "additionalProperties": False}


def test_fifty_json_schemas_all_validate(server):
    rng = random.Random(17)
    schemas = [random_object(rng, 0) for _ in range(NUM_SCHEMAS)]

    def run(i: int) -> tuple[dict, str, str]:
        schema = schemas[i]
        if i % 2:
            body = chat_body("Give me JSON.", max_tokens=MAX_TOKENS, temperature=1.0, seed=i, response_format={
                "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
            text, finish = complete(server.url, "/v1/chat/completions", body)
        else:
            body = completion_body("JSON:", max_tokens=MAX_TOKENS, temperature=1.0, seed=i, guided_json=schema)
            text, finish = complete(server.url, "/v1/completions", body)
        return schema, text, finish

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(NUM_SCHEMAS)))
    for schema, text, finish in results:
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


def test_regex_choice_grammar_and_json_object(server, tiny_model):
    tokenizer = Tokenizer.from_model_path(tiny_model)
    regex = r"[A-Z][a-z]{2,6}-[0-9]{3}"
    for seed in range(3):
        text, finish = complete(server.url, "/v1/completions", completion_body(
            "Code:", max_tokens=40, temperature=1.0, seed=seed, guided_regex=regex))
        assert re.fullmatch(regex, text) and finish == "stop", text
        choices = ["alpha", "beta gamma", "delta"]
        text, _ = complete(server.url, "/v1/chat/completions", chat_body(
            "Pick one.", max_tokens=20, temperature=1.0, seed=seed, structured_outputs={"choice": choices}))
        assert text in choices, text
    r = httpx.post(server.url + "/v1/completions", json=completion_body(
        "Code:", max_tokens=40, temperature=1.0, n=3, guided_regex=regex), timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200 and len(r.json()["choices"]) == 3, r.text
    assert all(re.fullmatch(regex, c["text"]) for c in r.json()["choices"]), r.text  # each sample has its matcher
    text, _ = complete(server.url, "/v1/completions", completion_body(
        "Yes or no:", max_tokens=20, temperature=0, guided_grammar='start: "yes" | "no" ("!")?'))
    assert text in ("yes", "no", "no!"), text
    # any JSON object: a random model's strings would run on for thousands of tokens, so quotes and closing
    # braces are made likelier (logit_bias applies before the grammar's mask)
    closing = {str(tokenizer.token_to_id(t)): 8.0 for t in ('"', "}")}
    text, finish = complete(server.url, "/v1/chat/completions", chat_body(
        "JSON please.", max_tokens=MAX_TOKENS, temperature=1.0, seed=3, logit_bias=closing,
        response_format={"type": "json_object"}))
    assert finish == "stop" and isinstance(json.loads(text), dict), text


def test_broken_constraints_are_a_400_that_names_the_problem(server):
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
              "response_format.json_schema.schema"),
             ({"guided_regex": "([a-z"}, "guided_regex"),
             ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
             ({"guided_choice": []}, "guided_choice"),
             ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
             ({"guided_regex": "a", "use_beam_search": True, "n": 2}, "use_beam_search"),
             ({"guided_json": {"type": "string", "maxLength": "x" * 70000}}, "guided_json")]
    for extra, param in cases:
        r = httpx.post(server.url + "/v1/chat/completions", json=chat_body("Hi", max_tokens=4, **extra),
                       timeout=REQUEST_TIMEOUT_S)
        err = assert_openai_error(r, 400, param)
        assert param.split(".")[0] in err["message"], err
    r = httpx.post(server.url + "/api/generate", json={"model": MODEL_NAME, "prompt": "Hi", "stream": False,
                                                       "format": {"type": "object", "properties": {"a": 5}}},
                   timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 400 and "format is invalid" in r.json()["error"], r.text


def test_ollama_format_is_enforced(server):
    client = ollama.Client(host=server.url, timeout=REQUEST_TIMEOUT_S)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                               "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "rank"], "additionalProperties": False}
    reply = client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": "A city?"}], format=schema,
                        options={"temperature": 1.0, "seed": 1, "num_predict": 200})
    jsonschema.validate(json.loads(reply.message.content), schema)
    reply = client.generate(model=MODEL_NAME, prompt="Some JSON:", format=schema,
                            options={"temperature": 1.0, "seed": 2, "num_predict": 200})
    jsonschema.validate(json.loads(reply.response), schema)


def test_a_plain_request_batched_with_constrained_ones_is_unchanged(server):
    plain = completion_body("The weather today is", max_tokens=24, temperature=0, ignore_eos=True)
    alone, _ = complete(server.url, "/v1/completions", plain)

    schema = random_object(random.Random(5), 0)

    def constrained(seed: int) -> str:
        return complete(server.url, "/v1/completions", completion_body(
            "JSON:", max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, guided_json=schema))[0]

    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(constrained, seed) for seed in range(3)]
        batched = pool.submit(complete, server.url, "/v1/completions", plain)
        assert batched.result()[0] == alone
        for other in others:
            jsonschema.validate(json.loads(other.result()), schema)
