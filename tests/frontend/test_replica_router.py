"""ReplicaRouter: the least loaded replica (waiting x 4 + running, with requests the stats do not show yet counted as
running, or as waiting behind a queue), idle replicas in turn, and the replica caching the prompt's prefix unless it is overloaded."""
from tinyvllm.frontend.engine.replica_router import PrefixIndex, ReplicaRouter, RoutingPolicy, prompt_block_hashes
from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.block_hash import hash_block, root_hash

BLOCK = 16
IDLE = SchedulerStats()


def stats(running: int = 0, waiting: int = 0) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_waiting=waiting)


def router_with_prompt_on(replica: int, prompt: list[int], size: int = 2) -> ReplicaRouter:
    router = ReplicaRouter(size)
    for r in range(size):
        router.prefixes[r].reset(capacity=1000)
    router.opened(replica, prompt_block_hashes(prompt, BLOCK), 1)
    router.closed(replica, 1)
    return router


def test_block_hashes_are_the_schedulers_prefix_cache_keys():
    tokens = list(range(40))  # two full blocks and a partial one, which is never cached
    first = hash_block(root_hash(None), tokens[:16])
    assert prompt_block_hashes(tokens, BLOCK) == [first, hash_block(first, tokens[16:32])]
    assert prompt_block_hashes(tokens[:15], BLOCK) == []


def test_the_least_loaded_replica_wins_and_a_waiting_request_weighs_four():
    router = ReplicaRouter(2)
    assert router.choose({0: stats(running=3), 1: stats(running=1)}, []) == 1
    assert router.choose({0: stats(waiting=1), 1: stats(running=3)}, []) == 1  # 4 > 3
    assert router.choose({0: stats(waiting=1), 1: stats(running=5)}, []) == 0


def test_requests_routed_since_the_last_stats_count_as_running_or_behind_the_queue():
    router = ReplicaRouter(2)
    router.opened(0, [], 2)  # not in replica 0's stats yet
    assert router.load(0, IDLE) == 2  # no queue there: they run at once
    assert router.load(0, stats(waiting=1)) == 4 + 4 * 1  # 1 of them is the waiting one; the other waits too
    assert router.choose({0: IDLE, 1: stats(running=3)}, []) == 0
    assert router.load(0, stats(running=2)) == 2  # the stats caught up: counted once
    router.closed(0, 2)
    assert router.load(0, stats(running=2)) == 2  # finished, the stats not caught up yet: they still count


def test_late_stats_do_not_unbalance_requests_that_arrive_together():
    """4 requests, one replica's stats current and the other's a moment late: 2 and 2, whichever is late."""
    for late in (0, 1):
        router, seen = ReplicaRouter(2), {0: 0, 1: 0}
        for _ in range(4):
            views = {r: IDLE if r == late else stats(running=seen[r]) for r in (0, 1)}
            choice = router.choose(views, [])
            router.opened(choice, [], 1)
            seen[choice] += 1
        assert router.open_sequences == [2, 2]


def test_idle_replicas_take_turns():
    router = ReplicaRouter(3)
    assert [router.choose({0: IDLE, 1: IDLE, 2: IDLE}, []) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_only_serving_replicas_are_chosen():
    router = ReplicaRouter(3)
    assert {router.choose({0: stats(running=9), 2: stats(running=9)}, []) for _ in range(4)} == {0, 2}


def test_a_prompt_goes_where_its_prefix_is_cached_even_if_that_replica_is_busier():
    prompt = list(range(3 * BLOCK + 5))
    router = router_with_prompt_on(1, prompt)
    other_question = prompt[:2 * BLOCK] + [999] * 20  # shares two blocks
    assert router.choose({0: IDLE, 1: stats(running=6, waiting=2)}, prompt_block_hashes(other_question, BLOCK)) == 1


def test_the_longest_cached_prefix_wins():
    prompt = list(range(4 * BLOCK))
    router = router_with_prompt_on(1, prompt, size=3)
    router.opened(2, prompt_block_hashes(prompt[:2 * BLOCK], BLOCK), 1)
    assert router.choose({0: IDLE, 1: stats(running=2), 2: IDLE}, prompt_block_hashes(prompt, BLOCK)) == 1


def test_an_overloaded_cache_holder_loses_to_the_least_loaded():
    prompt = list(range(3 * BLOCK))
    hashes = prompt_block_hashes(prompt, BLOCK)
    router = router_with_prompt_on(1, prompt)
    assert router.choose({0: IDLE, 1: stats(running=33)}, hashes) == 0  # 33 - 0 > 32 and 33 > 0 x 1.5
    assert router.choose({0: stats(running=100), 1: stats(running=140)}, hashes) == 1  # 140 < 100 x 1.5
    assert router.choose({0: stats(running=100), 1: stats(running=151)}, hashes) == 0
    loose = ReplicaRouter(2, RoutingPolicy(balance_abs=1000))
    loose.prefixes[1].reset(1000)
    loose.opened(1, hashes, 0)
    assert loose.choose({0: IDLE, 1: stats(running=500)}, hashes) == 1


def test_a_partial_block_is_no_reason_to_prefer_a_replica():
    prompt = list(range(BLOCK - 1))
    router = router_with_prompt_on(1, prompt)
    assert prompt_block_hashes(prompt, BLOCK) == []
    assert router.choose({0: IDLE, 1: stats(running=1)}, []) == 0


def test_the_prefix_index_forgets_the_least_recently_used_blocks_and_all_on_reset():
    index = PrefixIndex(capacity=3)
    a = prompt_block_hashes(list(range(2 * BLOCK)), BLOCK)
    b = prompt_block_hashes(list(range(100, 100 + 2 * BLOCK)), BLOCK)
    index.add(a)
    index.add(b)  # a's first block is the oldest: gone
    assert len(index) == 3 and index.matched_blocks(a) == 0 and index.matched_blocks(b) == 2
    index.add(a[1:])  # used again: now b's first block is the oldest
    index.add(a[:1])
    assert index.matched_blocks(a) == 2 and index.matched_blocks(b) == 0
    index.reset(capacity=10)
    assert len(index) == 0 and index.capacity == 10


def test_kv_events_from_the_engine_move_the_cache_aware_choice(tmp_path):
    """With --kv-events-config the router follows each engine's stores and evictions (kv_event_follower.py): a
    prompt whose blocks replica 1 stored draws requests there, and none once they are evicted; a malformed batch
    changes nothing."""
    import asyncio

    import zmq
    import zmq.asyncio

    from tinyvllm.frontend.engine.kv_event_follower import follow_kv_events
    from tinyvllm.protocol.kv_events import BlockRemoved, BlockStored
    from tinyvllm.protocol.kv_events_config import KVEventsConfig
    from tinyvllm.scheduler.kv_events import KVEventPublisher

    prompt = list(range(3 * BLOCK))
    hashes = prompt_block_hashes(prompt, BLOCK)
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"ipc://{tmp_path}/events", topic="kv")

    async def scenario():
        router = ReplicaRouter(2)
        for r in range(2):
            router.prefixes[r].reset(capacity=1000)
        sync_ctx, ctx = zmq.Context(), zmq.asyncio.Context()
        publisher = KVEventPublisher(sync_ctx, config, data_parallel_rank=1)  # engine 1's sockets
        follower = asyncio.create_task(follow_kv_events(ctx, config, 1, router.prefixes[1].apply_events))
        idle = {0: IDLE, 1: stats(running=1)}  # replica 0 is the least loaded

        async def until(choice: int) -> bool:
            for _ in range(200):
                if router.choose(idle, hashes) == choice:
                    return True
                publisher.publish([])  # PUB drops until the SUB's subscription is through: keep the line busy
                await asyncio.sleep(0.02)
            return False

        try:
            assert router.choose(idle, hashes) == 0
            while router.prefixes[1].matched_blocks(hashes) < 3:  # a batch may precede the subscription: again
                publisher.publish([BlockStored(hashes, None, prompt, BLOCK)])
                await asyncio.sleep(0.02)
            assert await until(1)
            publisher.pub.send_multipart((b"kv", bytes(8), b"\xc1"))  # not msgpack
            publisher.publish([BlockRemoved(hashes[:1])])
            assert await until(0)  # the prompt's first block is gone from engine 1: no prefix there
            assert router.prefixes[1].matched_blocks(hashes[1:]) == 2
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            publisher.close()
            sync_ctx.destroy(linger=0)
            ctx.destroy(linger=0)

    asyncio.run(scenario())


def test_a_prefix_index_applies_stores_removals_and_clears_and_ignores_malformed_events():
    index = PrefixIndex(capacity=10)
    index.apply({"type": "BlockStored", "block_hashes": [1, 2, 3]})
    index.apply({"type": "BlockRemoved", "block_hashes": [2, "x"]})
    index.apply({"type": "BlockStored", "block_hashes": "nope"})
    index.apply({"type": "Unknown", "block_hashes": [9]})
    assert len(index) == 2
    index.apply({"type": "AllBlocksCleared"})
    assert len(index) == 0
