"""A long prompt is prefilled in chunks while running requests keep decoding, one token every step."""
import pytest

from fake_worker import make_request, make_scheduler, step


@pytest.mark.parametrize("caching", [True, False])
def test_a_decoding_request_gets_a_token_every_step_while_a_long_prompt_is_chunked(caching):
    sched, worker = make_scheduler(max_num_batched_tokens=256, max_model_len=4096, block_size=16, num_blocks=256,
                                   enable_prefix_caching=caching)
    sched.add_request(make_request("decoder", 10, max_tokens=100))
    step(sched, worker)
    sched.add_request(make_request("long", 1500, max_tokens=3))
    chunks, steps = [], 0
    while not sched.requests["long"].output_token_ids:
        plan, outs = step(sched, worker)
        steps += 1
        by_id = {r.req_id: r for r in plan.new_reqs + plan.cached_reqs}
        assert by_id["decoder"].num_scheduled_tokens == 1 and outs["decoder"].new_token_ids, f"step {steps}"
        chunks.append(by_id["long"].num_scheduled_tokens)
        assert sum(r.num_scheduled_tokens for r in by_id.values()) <= 256
    assert chunks == [255] * 5 + [1500 - 5 * 255] and steps == 6
    assert worker.num_computed_by_req["long"] == 1500
    assert len(sched.requests["decoder"].output_token_ids) == 1 + steps


def test_several_decoders_and_two_long_prompts_share_the_budget():
    sched, worker = make_scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024, block_size=8,
                                   num_blocks=512)
    for i in range(4):
        sched.add_request(make_request(f"d{i}", 5, max_tokens=200))
    step(sched, worker)
    sched.add_request(make_request("p0", 300, max_tokens=2))
    sched.add_request(make_request("p1", 200, max_tokens=2))
    decoders = {f"d{i}" for i in range(4)}
    while "p1" in sched.requests and not sched.requests["p1"].output_token_ids:
        _, outs = step(sched, worker)
        assert decoders <= set(outs)  # every decoder gained a token in this step
    assert worker.num_computed_by_req["p0"] == 300 + 1 and worker.num_computed_by_req["p1"] == 200
