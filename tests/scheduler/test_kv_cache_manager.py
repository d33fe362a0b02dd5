import pytest

from fake_worker import make_request
from invariants import check_kv_cache, free_block_ids, num_cached_blocks
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.request import Request, RequestStatus


def computed(kv: KVCacheManager, req: Request, num_tokens: int) -> Request:
    """Allocates and 'computes' req's first num_tokens tokens, registering its full blocks."""
    assert kv.allocate_slots(req, num_tokens)
    req.num_computed_tokens = num_tokens
    kv.cache_computed_blocks(req)
    return req


def test_request_token_properties():
    req = make_request("r", prompt_len=3)
    req.output_token_ids += [7, 8]
    assert req.num_prompt_tokens == 3 and req.num_tokens == 5
    assert req.all_token_ids == req.prompt_token_ids + [7, 8]
    for start, end in [(0, 2), (1, 4), (3, 5), (0, 5), (4, 5)]:
        assert req.token_ids_between(start, end) == req.all_token_ids[start:end]
    assert req.status is RequestStatus.WAITING and req.block_ids == [] and req.num_computed_tokens == 0
    assert req.output_id == "r" and req.compute_limit == 5


def test_requests_compare_by_identity():
    a, b = make_request("r", 3), make_request("r", 3)
    assert a != b and a == a


def test_allocate_on_demand_grows_the_block_table():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("r", 10)
    assert kv.allocate_slots(req, 1) and len(req.block_ids) == 1
    assert kv.allocate_slots(req, 4) and len(req.block_ids) == 1
    assert kv.allocate_slots(req, 5) and len(req.block_ids) == 2
    assert kv.allocate_slots(req, 3) and len(req.block_ids) == 2  # never shrinks
    assert kv.num_free_blocks == 6 and kv.usage == pytest.approx(2 / 8)
    check_kv_cache(kv, [req])


def test_allocate_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request("a", 1), make_request("b", 1)
    assert kv.allocate_slots(a, 8)
    assert not kv.allocate_slots(b, 8)
    assert b.block_ids == [] and kv.num_free_blocks == 1
    check_kv_cache(kv, [a, b])


def test_free_returns_blocks_tail_first_and_clears_the_table():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    req = make_request("r", 1)
    kv.allocate_slots(req, 6)
    held = list(req.block_ids)
    kv.free(req)
    assert req.block_ids == [] and kv.num_free_blocks == 4
    assert free_block_ids(kv.pool)[-3:] == held[::-1]
    check_kv_cache(kv, [req])


def test_the_cache_hit_stops_before_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = computed(kv, make_request("a", 12), 12)  # three full blocks cached
    same = make_request("b", 0, prompt=list(first.prompt_token_ids))
    assert kv.find_cached_prefix(same) == first.block_ids[:2]  # the third block holds the last token: recompute
    longer = make_request("c", 0, prompt=first.prompt_token_ids + [1])
    assert kv.find_cached_prefix(longer) == first.block_ids
    diverging = make_request("d", 0, prompt=first.prompt_token_ids[:5] + [0] * 8)
    assert kv.find_cached_prefix(diverging) == first.block_ids[:1]
    assert kv.find_cached_prefix(make_request("e", 0, prompt=[0] + first.prompt_token_ids)) == []


def test_admit_revives_cached_blocks_and_allocates_the_rest_all_or_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    first = computed(kv, make_request("a", 8), 8)
    cached = list(first.block_ids)
    kv.free(first)
    other = make_request("b", 0, prompt=first.prompt_token_ids + [1, 2, 3, 4, 5])
    hits = kv.find_cached_prefix(other)
    assert hits == cached
    hog = make_request("hog", 1)
    assert kv.allocate_slots(hog, 4)  # 3 free blocks left, 2 of them the cached ones
    assert not kv.admit(other, hits, 16)  # needs the 2 cached + 2 fresh
    assert other.block_ids == [] and kv.num_free_blocks == 3
    assert kv.admit(other, hits, 12)
    assert other.block_ids[:2] == cached and other.num_registered_blocks == 2 and kv.num_free_blocks == 0
    check_kv_cache(kv, [other, hog])


def test_disabled_caching_never_hits_nor_registers():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False)
    first = computed(kv, make_request("a", 12), 12)
    assert num_cached_blocks(kv.pool) == 0
    assert kv.find_cached_prefix(make_request("b", 0, prompt=first.prompt_token_ids + [1])) == []


def test_cache_salt_separates_caches():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    salted = make_request("a", 8)
    salted.cache_salt = "tenant-1"
    computed(kv, salted, 8)
    prompt = salted.prompt_token_ids + [1]
    assert kv.find_cached_prefix(make_request("b", 0, prompt=prompt)) == []
    same_salt = make_request("c", 0, prompt=prompt)
    same_salt.cache_salt = "tenant-1"
    assert kv.find_cached_prefix(same_salt) == salted.block_ids


def test_a_hash_collision_is_not_a_hit():
    kv = KVCacheManager(num_blocks=8, block_size=2, hash_fn=lambda parent, tokens: b"everything collides")
    first = computed(kv, make_request("a", 4), 4)
    assert num_cached_blocks(kv.pool) == 1  # the second block's hash was taken: not registered
    assert kv.find_cached_prefix(make_request("b", 0, prompt=first.prompt_token_ids + [9])) == first.block_ids[:1]
    assert kv.find_cached_prefix(make_request("c", 0, prompt=[0, 0, 0])) == []


def test_fork_shares_every_block_and_copy_on_write_separates_the_writer():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    parent = computed(kv, make_request("p", 7), 6)  # block 0 full, block 1 half written
    child = make_request("c", 0, prompt=list(parent.prompt_token_ids))
    kv.fork(parent, child)
    child.num_computed_tokens = 6
    assert child.block_ids == parent.block_ids and kv.pool.blocks[parent.block_ids[1]].ref_count == 2
    check_kv_cache(kv, [parent, child])
    assert kv.shared_blocks_to_write(child) == [1]  # block 0 is full: never written again
    assert kv.allocate_slots(child, 7)
    assert child.block_ids[0] == parent.block_ids[0] and child.block_ids[1] != parent.block_ids[1]
    assert kv.take_block_copies() == [[parent.block_ids[1], child.block_ids[1]]]
    assert kv.shared_blocks_to_write(parent) == []  # the last holder writes in place
    assert kv.take_block_copies() == []
    check_kv_cache(kv, [parent, child])


def test_copy_on_write_needs_a_free_block():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    parent = computed(kv, make_request("p", 3), 2)
    child = make_request("c", 0, prompt=list(parent.prompt_token_ids))
    kv.fork(parent, child)
    child.num_computed_tokens = 2
    assert kv.allocate_slots(make_request("hog", 1), 1)
    assert not kv.allocate_slots(child, 3)
    assert child.block_ids == parent.block_ids and kv.take_block_copies() == []
