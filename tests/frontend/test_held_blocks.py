"""frontend/engine/held_blocks.py: the union of the engines' cached blocks, as GET /kv_events tells it."""
import asyncio

import pytest

from tinyvllm.frontend.engine import held_blocks
from tinyvllm.frontend.engine.held_blocks import HeldBlocks


def stored(*keys):
    return {"type": "BlockStored", "block_hashes": list(keys)}


def removed(*keys):
    return {"type": "BlockRemoved", "block_hashes": list(keys)}


def drain(*subscriptions) -> list[list]:
    """Each subscription's batches until it is quiet (None where it ended), all in one event loop."""
    async def take(subscription):
        batches = []
        while True:
            try:
                batch = await subscription.next(0.01)
            except TimeoutError:
                return batches
            batches.append(batch)
            if batch is None:
                return batches

    async def take_all():
        return [await take(s) for s in subscriptions]
    return asyncio.run(take_all())


def rebuilt(batches: list[dict]) -> set[int]:
    """The set a subscriber (a router's PrefixIndex) rebuilds from the batches."""
    held = set()
    for batch in batches:
        for event in batch["events"]:
            if event["type"] == "AllBlocksCleared":
                held.clear()
            elif event["type"] == "BlockStored":
                held |= set(event["block_hashes"])
            else:
                held -= set(event["block_hashes"])
    return held


def test_subscribers_hear_the_union_of_the_engines_blocks():
    held = HeldBlocks(2)
    held.engine_ready(0, block_size=16, num_blocks=100)
    held.engine_ready(1, block_size=16, num_blocks=50)
    held.apply(0, [stored(1, 2, 3)])
    subscription = held.subscribe()
    held.apply(1, [stored(3, 4), "junk", {"type": "BlockStored", "block_hashes": "nope"}])  # 3: already held
    held.apply(0, [removed(3, 9)])  # engine 1 still holds 3; 9 was never held
    held.apply(1, [removed(3)])  # now nobody does
    held.apply(0, [{"type": "AllBlocksCleared"}])  # engine 0 restarted: 1 and 2 go
    [batches] = drain(subscription)
    first = batches[0]
    assert (first["block_size"], first["num_blocks"]) == (16, 150)
    assert rebuilt(batches[:1]) == {1, 2, 3}
    assert [b["events"] for b in batches[1:]] == [[stored(4)], [removed(3)], [removed(1, 2)]]
    assert rebuilt(batches) == {4} and len(held) == 1


def test_an_engine_that_starts_again_loses_its_blocks_even_without_its_clear_event():
    held = HeldBlocks(1)
    held.engine_ready(0, 16, 10)
    held.apply(0, [stored(7, 8)])
    subscription = held.subscribe()
    held.engine_ready(0, 16, 10)
    assert rebuilt(drain(subscription)[0]) == set() and len(held) == 0


def test_a_subscriber_too_far_behind_is_dropped_after_what_it_has_and_others_go_on(monkeypatch):
    monkeypatch.setattr(held_blocks, "MAX_QUEUED_BATCHES", 3)
    held = HeldBlocks(1)
    slow, also_slow = held.subscribe(), held.subscribe()
    for key in range(5):
        held.apply(0, [stored(key)])
    assert slow.dropped and also_slow.dropped
    fresh = held.subscribe()
    held.apply(0, [removed(0)])
    held.close()
    slow_batches, fresh_batches = drain(slow, fresh)
    assert slow_batches[3:] == [None] and rebuilt(slow_batches[:3]) == {0, 1}  # the whole set, two changes, the end
    assert fresh_batches[-1] is None and rebuilt(fresh_batches[:-1]) == {1, 2, 3, 4}


@pytest.mark.parametrize("count", [0, 1])
def test_close_ends_every_stream(count):
    held = HeldBlocks(1)
    subscriptions = [held.subscribe() for _ in range(count)]
    held.close()
    assert all(batches == [batches[0], None] for batches in drain(*subscriptions))
