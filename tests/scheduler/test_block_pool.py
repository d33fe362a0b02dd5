import pytest

from invariants import check_block_pool, free_block_ids, num_cached_blocks
from tinyvllm.protocol.block_hash import hash_block, root_hash
from tinyvllm.scheduler.block_pool import BlockPool

ROOT = root_hash(None)


def cache(pool: BlockPool, block_id: int, tokens: tuple[int, ...], parent: bytes = ROOT) -> bytes:
    block_hash = hash_block(parent, tokens)
    pool.register(block_id, block_hash, parent, tokens)
    return block_hash


def test_fresh_blocks_come_from_the_front_with_one_holder():
    pool = BlockPool(4)
    assert pool.take_fresh(2) == [0, 1]
    assert [pool.blocks[i].ref_count for i in range(4)] == [1, 1, 0, 0]
    assert pool.num_free_blocks == 2 and free_block_ids(pool) == [2, 3]
    with pytest.raises(ValueError):
        pool.take_fresh(3)
    check_block_pool(pool, [[0, 1]])


def test_released_blocks_join_the_tail_in_the_order_given():
    pool = BlockPool(4)
    table = pool.take_fresh(3)
    pool.release(reversed(table))
    assert free_block_ids(pool) == [3, 2, 1, 0]
    check_block_pool(pool, [])


def test_a_shared_block_is_freed_by_its_last_holder():
    pool = BlockPool(2)
    (block_id,) = pool.take_fresh(1)
    pool.hold([block_id])
    check_block_pool(pool, [[block_id], [block_id]])
    pool.release([block_id])
    assert pool.num_free_blocks == 1 and pool.blocks[block_id].ref_count == 1
    pool.release([block_id])
    assert pool.num_free_blocks == 2
    with pytest.raises(AssertionError):
        pool.release([block_id])


def test_cached_free_blocks_keep_their_hash_until_evicted_least_recently_used_first():
    pool = BlockPool(3)
    a, b, c = pool.take_fresh(3)
    hashes = {block_id: cache(pool, block_id, (block_id,)) for block_id in (a, b, c)}
    pool.release([b])
    pool.release([c])
    pool.release([a])  # free queue: b, c, a
    assert num_cached_blocks(pool) == 3 and pool.num_free_blocks == 3
    assert pool.lookup(hashes[b], ROOT, (b,)) == b  # cached free blocks are still found
    assert pool.take_fresh(1) == [b]  # evicting b: it was freed first
    assert pool.lookup(hashes[b], ROOT, (b,)) is None and pool.blocks[b].block_hash is None
    assert pool.lookup(hashes[c], ROOT, (c,)) == c
    check_block_pool(pool, [[b]])


def test_holding_a_cached_free_block_revives_it_out_of_the_middle_of_the_queue():
    pool = BlockPool(3)
    blocks = pool.take_fresh(3)
    block_hash = cache(pool, blocks[1], (7, 7))
    pool.release(blocks)
    pool.hold([blocks[1]])
    assert free_block_ids(pool) == [blocks[0], blocks[2]] and pool.blocks[blocks[1]].ref_count == 1
    assert pool.take_fresh(2) == [blocks[0], blocks[2]]  # the revived block is not handed out again
    assert pool.lookup(block_hash, ROOT, (7, 7)) == blocks[1]
    check_block_pool(pool, [[blocks[1]], [blocks[0]], [blocks[2]]])


def test_lookup_checks_tokens_and_parent_not_just_the_hash():
    pool = BlockPool(2)
    (block_id,) = pool.take_fresh(1)
    pool.register(block_id, b"same-hash", ROOT, (1, 2))
    assert pool.lookup(b"same-hash", ROOT, (1, 2)) == block_id
    assert pool.lookup(b"same-hash", ROOT, (1, 3)) is None  # a collision: other tokens
    assert pool.lookup(b"same-hash", b"other-parent", (1, 2)) is None


def test_the_first_registration_of_a_content_wins():
    pool = BlockPool(2)
    first, second = pool.take_fresh(2)
    block_hash = cache(pool, first, (5,))
    cache(pool, second, (5,))
    assert pool.lookup(block_hash, ROOT, (5,)) == first and pool.blocks[second].block_hash is None
    cache(pool, first, (6,))  # a block keeps the hash it was registered with
    assert pool.blocks[first].block_hash == block_hash
    check_block_pool(pool, [[first], [second]])


@pytest.mark.parametrize("corrupt", ["leak", "double_free", "free_and_held", "wrong_refcount", "stale_hash"])
def test_check_block_pool_catches_corruption(corrupt):
    pool = BlockPool(4)
    table = pool.take_fresh(2)
    tables = [table]
    if corrupt == "leak":
        tables = []
    elif corrupt == "double_free":
        pool.blocks[free_block_ids(pool)[0]].ref_count = -1
    elif corrupt == "free_and_held":
        table.append(free_block_ids(pool)[0])
    elif corrupt == "wrong_refcount":
        pool.blocks[table[0]].ref_count = 2
    elif corrupt == "stale_hash":
        pool.blocks[table[0]].block_hash = b"never registered"
    with pytest.raises(AssertionError):
        check_block_pool(pool, tables)
