"""Routing among instances: the least loaded (running + 4 x waiting, plus the router's own open requests the last
report does not show), the one that served the prompt's prefix unless it is overloaded, and prompt text as hashed
chunks (the router has no tokenizer)."""
import json

from tinyvllm.frontend.engine.replica_router import CACHE, LEAST_LOADED, LOAD, ROUND_ROBIN, TURN, RoutingPolicy
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import Instance, Load
from tinyvllm.frontend.router.prompt_chunks import CHUNK_CHARS, chunk_hashes, prompt_text, request_chunk_hashes

LONG = "You are a helpful assistant. " * 20  # several chunks


def instances(*loads: Load) -> list[Instance]:
    return [Instance(f"http://10.0.0.{i}:8000", "registered", load=load, healthy=True) for i, load in enumerate(loads)]


def test_nothing_to_pick_from():
    assert InstancePicker().pick([], []) is None


def test_the_least_loaded_instance_wins_and_waiting_weighs_four():
    a, b = instances(Load(running=3), Load(waiting=1))
    assert InstancePicker().pick([a, b], []) == (a, LOAD)  # 3 < 4
    a.load = Load(running=5)
    assert InstancePicker().pick([a, b], []) == (b, LOAD)


def test_the_routers_own_open_requests_count_until_a_report_shows_them():
    picker = InstancePicker()
    a, b = instances(Load(), Load())
    first, _ = picker.pick([a, b], [])
    picker.opened(first, [])
    second, _ = picker.pick([a, b], [])
    assert second is not first
    picker.opened(second, [])
    picker.opened(second, [])
    assert picker.pick([a, b], [])[0] is first
    first.load = Load(running=9)  # its report now shows 9 running (the router's one among them): 9 > 4 x 2
    assert picker.pick([a, b], [])[0] is second


def test_a_prompt_goes_where_its_prefix_went_unless_that_instance_is_overloaded():
    picker = InstancePicker()
    a, b = instances(Load(), Load())
    hashes = chunk_hashes(LONG)
    picker.opened(b, hashes)
    picker.closed(b)
    a.load = Load(running=1)
    b.load = Load(running=10)
    assert picker.pick([a, b], hashes) == (b, CACHE)  # 10 - 1 is within SGLang's 32
    assert picker.pick([a, b], chunk_hashes("something else entirely " * 10)) == (a, LOAD)
    b.load = Load(running=40)  # more than 32 above and 1.5 x the least
    assert picker.pick([a, b], hashes) == (a, LOAD)


def test_an_instance_back_under_the_same_url_starts_with_an_empty_prefix_memory():
    picker = InstancePicker()
    a, b = instances(Load(), Load(running=2))
    hashes = chunk_hashes(LONG)
    picker.opened(b, hashes)
    picker.closed(b)
    assert picker.pick([a, b], hashes) == (b, CACHE)
    b_again = Instance(b.url, "registered", load=Load(running=2), healthy=True)
    assert picker.pick([a, b_again], hashes) == (a, LOAD)
    assert len(picker.router.prefixes) == 2  # the URL kept its index


def test_the_prefix_memory_of_an_instance_that_left_is_dropped():
    picker = InstancePicker()
    a, b = instances(Load(), Load())
    picker.opened(b, chunk_hashes(LONG))
    picker.keep({a.url, b.url})
    assert picker.known_blocks(b.url) > 0
    picker.keep({a.url})
    assert picker.known_blocks(b.url) == 0 and picker.router.prefixes[picker._slots[b.url]].capacity == 0
    picker.opened(b, chunk_hashes(LONG))  # it came back: remembered again
    assert picker.known_blocks(b.url) > 0


def test_prompts_sharing_a_prefix_share_their_leading_chunk_hashes():
    first = chunk_hashes(LONG + "What is 2 + 2?")
    second = chunk_hashes(LONG + "Name a colour.")
    shared = len(LONG) // CHUNK_CHARS
    assert first[:shared] == second[:shared] and len(first) >= shared
    assert chunk_hashes("x" * (CHUNK_CHARS - 1)) == []  # a partial chunk is never a key


def test_the_prompt_text_of_each_api():
    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "Hi"}]
    assert prompt_text({"prompt": "Once upon"}) == "Once upon"
    assert prompt_text({"model": "m", "system": "Be brief.", "prompt": "Hi"}) == "Be brief.Hi"  # Ollama generate
    chat = prompt_text({"messages": messages})
    longer = prompt_text({"messages": messages + [{"role": "assistant", "content": "Hello"}]})
    assert longer.startswith(chat[:-1])  # a conversation that grows keeps its earlier text as a prefix
    assert prompt_text({"prompt": [1, 2, 3]}) == "[1,2,3]"
    assert prompt_text([1]) == "" and prompt_text({}) == ""


def test_request_bodies_that_are_not_json_have_no_hashes():
    assert request_chunk_hashes(b"") == [] and request_chunk_hashes(b"{not json") == []
    assert request_chunk_hashes(json.dumps({"prompt": LONG}).encode()) == chunk_hashes(LONG)


def test_least_loaded_routing_ignores_remembered_prefixes():
    picker = InstancePicker(RoutingPolicy(mode=LEAST_LOADED))
    assert not picker.uses_prefixes and InstancePicker().uses_prefixes  # the router hashes no prompt for it
    a, b = instances(Load(), Load(running=2))
    hashes = chunk_hashes(LONG)
    picker.opened(b, hashes)
    picker.closed(b)
    assert picker.pick([a, b], hashes) == (a, LOAD)  # cache-aware would send it to b (2 is within 32)
    a.load = Load(running=5)
    assert picker.pick([a, b], hashes) == (b, LOAD)


def test_round_robin_routing_takes_the_candidates_in_turn_whatever_their_load():
    picker = InstancePicker(RoutingPolicy(mode=ROUND_ROBIN))
    a, b, c = instances(Load(), Load(waiting=50), Load(running=9))
    hashes = chunk_hashes(LONG)
    picker.opened(a, hashes)
    picker.closed(a)
    picked = [picker.pick([a, b, c], hashes) for _ in range(6)]
    assert [reason for _, reason in picked] == [TURN] * 6
    assert [i for i, _ in picked] == [a, b, c, a, b, c]
    assert picker.pick([b, c], hashes)[0] is b  # a, whose turn it is, is gone: the next one still there
