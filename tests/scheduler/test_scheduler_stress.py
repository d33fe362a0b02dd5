"""Random workloads against the fake worker: invariants after every step, exact outputs at the end."""
import random
import zlib

import pytest

from fake_worker import EOS, default_token_fn, make_request, make_scheduler
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason


def random_token_fn(req_id: str, pos: int) -> int:
    return EOS if zlib.crc32(f"eos:{req_id}:{pos}".encode()) % 25 == 0 else default_token_fn(req_id, pos)


def reference_outputs(req, max_len: int) -> tuple[list[int], str]:
    """What the request yields when nothing interferes, computed independently of the scheduler."""
    tokens = []
    while True:
        tokens.append(random_token_fn(req.req_id, req.num_prompt_tokens + len(tokens)))
        last = tokens[-1]
        if (last in req.eos_token_ids and not req.sampling.ignore_eos) or last in req.sampling.stop_token_ids:
            return tokens, FinishReason.STOP
        if len(tokens) >= req.sampling.max_tokens or req.num_prompt_tokens + len(tokens) >= max_len:
            return tokens, FinishReason.LENGTH


def random_request(rng: random.Random, req_id: str, max_model_len: int):
    prompt_len = rng.choice([0, rng.randint(1, 8), rng.randint(1, max_model_len + 3)])
    stop_ids = [default_token_fn(req_id, prompt_len + rng.randint(0, 30))] if rng.random() < 0.3 else []
    return make_request(req_id, prompt_len, max_tokens=rng.randint(0, 30), ignore_eos=rng.random() < 0.2,
                        stop_token_ids=stop_ids, eos_token_ids=(EOS,) if rng.random() < 0.9 else ())


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_random_workload(seed, caching):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8])
    config = dict(max_num_seqs=rng.randint(1, 10), max_num_batched_tokens=rng.randint(1, 40),
                  max_model_len=rng.randint(4, 80), block_size=block_size, num_blocks=rng.randint(2, 160 // block_size),
                  enable_prefix_caching=caching)
    sched, worker = make_scheduler(**config, token_fn=random_token_fn)
    outputs: dict[str, list] = {}
    reqs = {}
    aborted = set()

    def collect(outs):
        for out in outs:
            assert not outputs.get(out.req_id) or outputs[out.req_id][-1].finish_reason is None, "output after the end"
            outputs.setdefault(out.req_id, []).append(out)

    def abort_some():
        ids = rng.sample(sorted(reqs), k=min(len(reqs), rng.randint(1, 3))) + ["unknown"]
        aborted.update(i for i in ids if i in sched.requests)
        sched.abort(ids)

    step, next_id = 0, 0
    while step < 1500 or sched.has_unfinished():
        if step < 1500 and rng.random() < 0.2:
            for _ in range(rng.randint(1, 3)):
                req = random_request(rng, f"s{seed}r{next_id}", config["max_model_len"])
                reqs[req.req_id] = req
                next_id += 1
                sched.add_request(req)
        if rng.random() < 0.05 and reqs:
            abort_some()
        plan = sched.schedule()
        if plan is not None:
            scheduled = plan.new_reqs + plan.cached_reqs
            assert len(scheduled) <= config["max_num_seqs"]
            assert sum(r.num_scheduled_tokens for r in scheduled) <= config["max_num_batched_tokens"]
            result = worker.execute(plan)
            if rng.random() < 0.05 and reqs:
                abort_some()  # while the step is in flight
            collect(sched.update_from_output(plan, result))
        check_scheduler_invariants(sched)
        collect(sched.take_pending_outputs())
        step += 1
        assert step < 100_000

    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_total_blocks
    max_len = min(config["max_model_len"], config["num_blocks"] * block_size + 1)
    finish_reasons = set()
    for req_id, req in reqs.items():
        outs = outputs[req_id]
        assert [o.finish_reason is not None for o in outs] == [False] * (len(outs) - 1) + [True]
        tokens, reason = [t for o in outs for t in o.new_token_ids], outs[-1].finish_reason
        finish_reasons.add(reason)
        if reason == FinishReason.ERROR:
            assert outs[-1].error and tokens == []
            assert (req.num_prompt_tokens == 0 or req.sampling.max_tokens < 1
                    or req.num_prompt_tokens >= config["max_model_len"]
                    or -(-req.num_prompt_tokens // block_size) > config["num_blocks"])
        elif reason == FinishReason.ABORT:
            assert req_id in aborted
            expected, _ = reference_outputs(req, max_len)
            assert tokens == expected[:len(tokens)]
        else:
            assert (tokens, reason) == reference_outputs(req, max_len)
            assert req.output_token_ids == tokens
    assert {FinishReason.STOP, FinishReason.LENGTH, FinishReason.ERROR} <= finish_reasons
