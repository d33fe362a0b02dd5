import pytest

from fake_worker import make_request
from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestStatus


def test_request_token_properties():
    req = make_request("r", prompt_len=3)
    req.output_token_ids += [7, 8]
    assert req.num_prompt_tokens == 3 and req.num_tokens == 5
    assert req.all_token_ids == req.prompt_token_ids + [7, 8]
    assert req.status is RequestStatus.WAITING and req.block_ids == [] and req.num_computed_tokens == 0


def test_requests_compare_by_identity():
    a, b = make_request("r", 3), make_request("r", 3)
    assert a != b and a == a


def test_allocate_on_demand_grows_the_block_table():
    bm = BlockManager(num_blocks=8, block_size=4)
    req = make_request("r", 10)
    assert bm.allocate(req, 1) and len(req.block_ids) == 1
    assert bm.allocate(req, 4) and len(req.block_ids) == 1
    assert bm.allocate(req, 5) and len(req.block_ids) == 2
    assert bm.allocate(req, 3) and len(req.block_ids) == 2  # never shrinks
    assert bm.num_free_blocks == 6 and bm.usage == pytest.approx(2 / 8)
    bm.check_invariants([req])


def test_allocate_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = make_request("a", 1), make_request("b", 1)
    assert bm.allocate(a, 8)
    assert not bm.allocate(b, 8)
    assert b.block_ids == [] and bm.num_free_blocks == 1
    bm.check_invariants([a, b])


def test_free_returns_blocks_tail_first_and_clears_the_table():
    bm = BlockManager(num_blocks=4, block_size=2)
    req = make_request("r", 1)
    bm.allocate(req, 6)
    held = list(req.block_ids)
    bm.free(req)
    assert req.block_ids == [] and bm.num_free_blocks == 4
    assert list(bm._free_block_ids)[-3:] == held[::-1]
    bm.check_invariants([req])


def test_shared_block_is_freed_by_its_last_holder():
    bm = BlockManager(num_blocks=2, block_size=2)
    a, b = make_request("a", 1), make_request("b", 1)
    bm.allocate(a, 2)
    b.block_ids.append(a.block_ids[0])  # what prefix caching will do
    bm.blocks[a.block_ids[0]].ref_count += 1
    bm.check_invariants([a, b])
    bm.free(a)
    assert bm.num_free_blocks == 1
    bm.free(b)
    assert bm.num_free_blocks == 2
    bm.check_invariants([a, b])


@pytest.mark.parametrize("corrupt", ["leak", "double_free", "free_and_held", "wrong_refcount"])
def test_check_invariants_catches_corruption(corrupt):
    bm = BlockManager(num_blocks=4, block_size=2)
    req = make_request("r", 1)
    bm.allocate(req, 4)
    holders: list[Request] = [req]
    if corrupt == "leak":
        holders = []
        for block_id in req.block_ids:
            bm.blocks[block_id].ref_count = 1
    elif corrupt == "double_free":
        bm._free_block_ids.append(bm._free_block_ids[0])
    elif corrupt == "free_and_held":
        req.block_ids.append(bm._free_block_ids[0])
    elif corrupt == "wrong_refcount":
        bm.blocks[req.block_ids[0]].ref_count = 2
    with pytest.raises(AssertionError):
        bm.check_invariants(holders)
