"""The scheduler reports each request's queue time (arrival to first scheduling) on its outputs."""
import time

from fake_worker import make_request, make_scheduler, step


def test_queue_time_is_arrival_to_first_admission():
    scheduler, worker = make_scheduler(max_num_seqs=1)
    now = time.time()
    scheduler.add_request(make_request("early", 4, max_tokens=2, arrival_time=now - 5.0))
    scheduler.add_request(make_request("late", 4, max_tokens=2, arrival_time=now))
    _, outs = step(scheduler, worker)
    assert 5.0 <= outs["early"].queue_time_s < 6.0  # admitted at once, 5 s after it arrived
    while "late" not in outs:  # waits for the only seat
        _, outs = step(scheduler, worker)
    assert outs["late"].queue_time_s >= 0.0


def test_no_queue_time_without_an_arrival_time():
    scheduler, worker = make_scheduler()
    scheduler.add_request(make_request("r", 4, max_tokens=1))
    _, outs = step(scheduler, worker)
    assert outs["r"].queue_time_s is None
