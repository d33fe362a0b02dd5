"""The persistent prefix cache's scheduler side (scheduler/disk_kv.py) with the fake worker and its fake disk:
saving full blocks, loading them after a "restart", a failed load recomputed, the size bound's LRU eviction."""
from fake_disk import FakeDisk
from fake_worker import (content_sample_fn, make_prompt, make_request, make_scheduler, run_to_completion, step,
                         tokens_of)
from tinyvllm.scheduler.disk_kv import scan_disk_dir
from tinyvllm.protocol.kv_disk_names import block_file_name

BLOCK = 8
SYSTEM = make_prompt("system prompt", 1000)


def engine(disk: FakeDisk, max_blocks_on_disk: int = 1000, num_blocks: int = 256):
    """A scheduler and fake worker over `disk`, as after a (re)start: the index is what is on disk."""
    sched, worker = make_scheduler(block_size=BLOCK, num_blocks=num_blocks, max_model_len=2048,
                                   max_num_batched_tokens=512, sample_fn=content_sample_fn)
    worker.disk = disk
    sched.disk_kv.open(disk.index(), max_blocks_on_disk, 1)
    return sched, worker


def serve(sched, worker, req_id: str, prompt: list[int]):
    sched.add_request(make_request(req_id, 0, max_tokens=5, prompt=prompt, temperature=0.0))
    outputs = run_to_completion(sched, worker)[req_id]
    return tokens_of(outputs), outputs[-1].num_cached_tokens


def test_full_blocks_survive_a_restart_and_count_as_cached():
    disk = FakeDisk()
    sched, worker = engine(disk)
    first, cached = serve(sched, worker, "a", SYSTEM)
    assert cached == 0
    assert len(disk.files) == (1000 + 4) // BLOCK  # every full block, prompt and output, once
    assert sched.disk_kv.num_bytes == len(disk.files)

    sched, worker = engine(disk)  # the restart: an empty pool, the files still there
    again, cached = serve(sched, worker, "a2", SYSTEM)
    assert again == first
    assert cached == 999 // BLOCK * BLOCK  # all but the last token's block
    assert worker.num_computed_by_req["a2"] == 1000 - cached + 4
    assert sched.disk_kv.num_loaded_blocks == 999 // BLOCK and sched.kv_cache_manager.num_free_blocks == 256

    # loaded blocks are ordinary cached blocks now: the next request finds them in memory, with no load
    loads = disk.num_loads
    _, cached = serve(sched, worker, "b", SYSTEM + [7, 8, 9])
    assert cached == 1000 // BLOCK * BLOCK and disk.num_loads == loads


def test_a_corrupt_file_is_recomputed_and_rewritten():
    disk = FakeDisk()
    sched, worker = engine(disk)
    first, _ = serve(sched, worker, "a", SYSTEM)
    probe = make_request("probe", 0, prompt=SYSTEM)
    sched.kv_cache_manager.find_cached_prefix(probe)  # hashes its blocks
    disk.corrupt.add(probe.block_hashes[40])

    sched, worker = engine(disk)
    again, cached = serve(sched, worker, "a2", SYSTEM)
    assert again == first, "a bad file changed the output"
    assert cached == 40 * BLOCK  # the good blocks before it; those after it are recomputed too
    assert sched.disk_kv.num_failed_blocks == 1
    assert probe.block_hashes[40] in disk.files, "the recomputed block was not saved again"


def test_the_size_bound_evicts_least_recently_used_files():
    disk = FakeDisk()
    sched, worker = engine(disk, max_blocks_on_disk=30)
    a, b = make_prompt("a", 20 * BLOCK + 1), make_prompt("b", 20 * BLOCK + 1)
    serve(sched, worker, "a", a)
    serve(sched, worker, "b", b)
    assert len(disk.files) == 30 and sched.disk_kv.num_bytes == 30
    assert set(disk.files) == set(sched.disk_kv.index)

    sched, worker = engine(disk, max_blocks_on_disk=30)
    _, cached_b = serve(sched, worker, "b2", b)
    _, cached_a = serve(sched, worker, "a2", a)
    assert cached_b == 20 * BLOCK  # the newest survived
    assert cached_a == 0  # a's first blocks were evicted first: nothing of its prefix is left to hit

    sched, worker = engine(disk, max_blocks_on_disk=10)  # a smaller bound at start deletes the oldest at once
    serve(sched, worker, "c", make_prompt("c", 3))
    assert len(disk.files) == 10


def test_an_aborted_request_leaves_its_loaded_blocks_cached():
    disk = FakeDisk()
    sched, worker = engine(disk)
    serve(sched, worker, "a", SYSTEM)
    sched, worker = engine(disk)
    sched.add_request(make_request("a2", 0, prompt=SYSTEM, temperature=0.0))
    plan, _ = step(sched, worker)
    assert plan.kv_disk_loads and not plan.new_reqs  # the load comes first, on its own
    sched.abort(["a2"])
    run_to_completion(sched, worker)
    _, cached = serve(sched, worker, "b", SYSTEM)
    assert cached == 999 // BLOCK * BLOCK and disk.num_loads == 999 // BLOCK


def test_disk_blocks_extend_a_hit_in_memory():
    disk = FakeDisk()
    sched, worker = engine(disk)
    first, _ = serve(sched, worker, "a", SYSTEM)
    sched, worker = engine(disk)
    _, cached = serve(sched, worker, "head", SYSTEM[:401])
    assert cached == 400 and disk.num_loads == 50
    again, cached = serve(sched, worker, "a2", SYSTEM)
    assert again == first and cached == 999 // BLOCK * BLOCK
    assert disk.num_loads == 999 // BLOCK, "blocks cached in memory were loaded again"


def test_scan_finds_blocks_every_rank_wrote(tmp_path):
    full, partial = bytes(range(16)), bytes(16)
    for name in (block_file_name(full, 0), block_file_name(full, 1), block_file_name(partial, 1), "x.tmp", "junk"):
        (tmp_path / name).write_bytes(b"12345")
    assert scan_disk_dir(str(tmp_path), world_size=2) == [(full, 10)]
    assert scan_disk_dir(str(tmp_path / "missing"), world_size=1) == []


def test_loads_into_a_tight_pool_keep_the_cached_part_of_the_prefix():
    disk = FakeDisk()
    sched, worker = engine(disk)
    first, _ = serve(sched, worker, "a", SYSTEM)
    sched, worker = engine(disk, num_blocks=127)  # the prompt and its outputs, hardly more
    serve(sched, worker, "head", SYSTEM[:401])
    serve(sched, worker, "other", make_prompt("other", 500))  # pushes the head's blocks towards eviction
    again, cached = serve(sched, worker, "a2", SYSTEM)
    assert again == first and cached == 999 // BLOCK * BLOCK
