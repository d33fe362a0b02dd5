"""Property-based: random mixes of arrivals, shared prefixes, n > 1, aborts (also of requests in flight or swapped
out), tiny pools, prefix caching on and off, 1 to 3 steps in flight, async scheduling on and off (with it a request
is planned again while in flight, the fake worker appending its own sampled token for a placeholder), CPU swap off,
tight or roomy (a preempted request swapped out or recomputed), sliding windows (blocks behind a request's window go
back to the pool: the fake worker reads only the window, and checks it), n-gram or draft-model speculative decoding
or none (without async scheduling; a "model" of three tokens, so drafts are proposed and often accepted; as the draft
model the fake worker proposes and checks that the request holds the lookahead slots its proposals' forwards write). After every plan
and every result the
scheduler's and the pool's invariants hold (no leaked or doubly freed block or swap slot, ref counts equal holders,
cached free blocks have none, a request's steps in flight follow one another) and the fake worker has checked every
KV read and every token a plan brings; in the end every request finished or was aborted, each with exactly what an
unpressured run would produce."""
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_worker import (EOS, content_sample_fn, make_prompt, make_request, make_scheduler, prefix_hashes,
                         with_random_eos)
from in_flight_driver import InFlightDriver
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.speculative_config import SpeculativeConfig
from tinyvllm.scheduler.parallel_sampling import child_id, child_seed

SAMPLE = with_random_eos(content_sample_fn, one_in=12)
FEW_TOKENS_SAMPLE = with_random_eos(lambda *args: 10 + content_sample_fn(*args) % 3, one_in=12)
NGRAM = SpeculativeConfig("ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1)
DRAFT = SpeculativeConfig("draft_model", num_speculative_tokens=2, model="draft.gguf")  # the fake worker proposes
PREFIXES = [make_prompt(f"prefix{i}", 16) for i in range(2)]
MAX_STEPS = 3000


@dataclass(frozen=True)
class Spec:
    prefix: int  # index into PREFIXES, or -1 for none
    prefix_len: int
    suffix_len: int
    max_tokens: int
    n: int
    mode: str  # greedy / seeded / random
    use_eos: bool


specs = st.builds(Spec, st.integers(-1, len(PREFIXES) - 1), st.integers(0, 16), st.integers(0, 6),
                  st.integers(1, 8), st.sampled_from([1, 2, 3]), st.sampled_from(["greedy", "seeded", "random"]),
                  st.booleans())
# "plan" only plans (up to the steps in flight): requests added before the next one go into steps of their own.
events = st.one_of(st.tuples(st.just("add"), specs), st.tuples(st.just("step"), st.integers(1, 4)),
                   st.tuples(st.sampled_from(["abort", "abort_in_flight", "abort_swapped"]), st.integers(0, 20)),
                   st.tuples(st.just("plan"), st.just(0)))
configs = st.fixed_dictionaries(dict(
    block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(2, 24), max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(1, 24), max_model_len=st.integers(8, 48),
    num_swap_slots=st.sampled_from([0, 0, 2, 6, 24]), swap_min_tokens=st.integers(1, 8),
    sliding_window=st.sampled_from([0, 0, 1, 3, 7])))


def build_request(req_id: str, spec: Spec):
    prompt = (PREFIXES[spec.prefix][:spec.prefix_len] if spec.prefix >= 0 else []) + make_prompt(req_id, spec.suffix_len)
    temperature = 0.0 if spec.mode == "greedy" else 1.0
    seed = zlib.crc32(req_id.encode()) % 1000 if spec.mode == "seeded" else None
    return make_request(req_id, 0, max_tokens=spec.max_tokens, prompt=prompt, n=spec.n, temperature=temperature,
                        seed=seed, eos_token_ids=(EOS,) if spec.use_eos else ())


def reference(req, index: int, max_len: int, sample=SAMPLE) -> tuple[list[int], str]:
    """What child `index` of req yields with nothing interfering, computed without the scheduler."""
    sampling = req.sampling
    row_id = req.req_id if sampling.n == 1 else child_id(req.req_id, index)
    seed = sampling.seed if sampling.n == 1 else child_seed(sampling.seed, index)
    row_sampling = type(sampling)(temperature=sampling.temperature, max_tokens=sampling.max_tokens, seed=seed)
    tokens, out = list(req.prompt_token_ids), []
    hashes = prefix_hashes(tokens)
    while True:
        token = sample(row_id, len(tokens), hashes[-1], row_sampling)
        out.append(token)
        tokens.append(token)
        prefix_hashes(tokens, hashes)
        if token in req.eos_token_ids:
            return out, FinishReason.STOP
        if len(out) >= sampling.max_tokens or len(tokens) >= max_len:
            return out, FinishReason.LENGTH


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=configs, script=st.lists(events, min_size=4, max_size=40), steps_in_flight=st.integers(1, 3),
       async_scheduling=st.booleans(), speculative=st.sampled_from([None, NGRAM, DRAFT]))
def test_random_mixes_keep_every_invariant_and_every_output(config, script, steps_in_flight, async_scheduling,
                                                            speculative):
    for caching in (True, False):  # drawing the script costs more than running it: run it both ways
        run_script(config, script, caching, steps_in_flight, async_scheduling and not speculative, speculative)


def run_script(config: dict, script: list, caching: bool, steps_in_flight: int, async_scheduling: bool,
               speculative: SpeculativeConfig | None = None) -> None:
    sample = FEW_TOKENS_SAMPLE if speculative else SAMPLE
    sched, worker = make_scheduler(sample_fn=sample, enable_prefix_caching=caching,
                                   max_steps_in_flight=steps_in_flight, async_scheduling=async_scheduling,
                                   speculative=speculative, **config)
    driver = InFlightDriver(sched, worker)
    reqs, outputs, aborted = {}, {}, set()

    def collect(outs):
        for out in outs:
            seen = outputs.setdefault((out.req_id, out.index), [])
            assert not seen or seen[-1].finish_reason is None, f"{out.req_id}#{out.index}: output after the end"
            seen.append(out)

    def abort(k: int):
        if reqs:
            req_id = sorted(reqs)[k % len(reqs)]
            aborted.add(req_id)
            sched.abort([req_id])

    def plan():
        for new in driver.fill():
            rows = new.new_reqs + new.cached_reqs
            assert len(rows) <= config["max_num_seqs"]
            assert sum(r.num_scheduled_tokens for r in rows) <= config["max_num_batched_tokens"]

    swap_aborts: list[int] = []  # aborts that wait for a request (or one child) to be swapped out

    def abort_swapped():
        swapped = [req for req in sched.waiting if req.swap_slots]
        if swapped and swap_aborts:
            victim = swapped[swap_aborts.pop() % len(swapped)]
            aborted.add(victim.output_id)
            sched.abort([victim.req_id])  # its slots must be free at once
            collect(sched.take_pending_outputs())
            check_scheduler_invariants(sched)

    def run_step(abort_mid_step: int | None = None) -> bool:
        """Plans up to steps_in_flight steps, then takes the oldest one's result; False if none was outstanding."""
        plan()
        if abort_mid_step is not None:
            abort(abort_mid_step)  # before the worker has run any outstanding plan
        stepped = bool(driver.outstanding)
        if stepped:
            collect(driver.finish_oldest())
        collect(sched.take_pending_outputs())
        check_scheduler_invariants(sched)
        abort_swapped()
        return stepped

    for kind, arg in script:
        if kind == "add":
            req = build_request(f"r{len(reqs)}", arg)
            reqs[req.req_id] = req
            sched.add_request(req)
            collect(sched.take_pending_outputs())
        elif kind == "abort":
            abort(arg)
            collect(sched.take_pending_outputs())
            check_scheduler_invariants(sched)
        elif kind == "abort_swapped":
            swap_aborts.append(arg)
            abort_swapped()
        elif kind == "abort_in_flight":
            run_step(abort_mid_step=arg)
        elif kind == "plan":
            plan()
        else:
            for _ in range(arg):
                run_step()
    for _ in range(MAX_STEPS):
        if not run_step():
            break
    assert not sched.has_unfinished() and not sched.groups, "requests left unfinished"
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_total_blocks and all(block.ref_count == 0 for block in kv.pool.blocks)
    assert sched.swap.num_free_slots == sched.swap.num_slots

    per_request = sched.config.blocks_per_request
    max_len = sched.max_len
    for req_id, req in reqs.items():
        if (req_id, 0) in outputs and outputs[(req_id, 0)][-1].finish_reason == FinishReason.ERROR:
            (error,) = outputs[(req_id, 0)]
            assert error.error and error.new_token_ids == []
            too_long = (-(-req.num_prompt_tokens // config["block_size"]) > config["num_blocks"] if per_request is None
                        else per_request > config["num_blocks"])
            assert req.num_prompt_tokens == 0 or req.num_prompt_tokens >= config["max_model_len"] or too_long
            continue
        for index in range(req.sampling.n):
            outs = outputs.get((req_id, index))
            assert outs, f"{req_id}#{index} never finished"
            tokens, reason = [t for o in outs for t in o.new_token_ids], outs[-1].finish_reason
            expected = reference(req, index, max_len, sample)
            if reason == FinishReason.ABORT:
                assert req_id in aborted and tokens == expected[0][:len(tokens)]
            else:
                assert (tokens, reason) == expected, f"{req_id}#{index}"
