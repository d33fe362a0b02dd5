"""A step's outputs on their way to the frontend, each message under the bound (codec.MAX_SEND_BYTES): one
StepOutputs as a rule, several when one would be over it (the frontend reads each on its own). An output too large
for any message (prompt logprobs of a long prompt, say) becomes an ERROR for its request, which ends."""
import time

import zmq

from tinyvllm.protocol import codec
from tinyvllm.protocol.codec import MessageTooLarge, fits_in_a_message
from tinyvllm.protocol.message_parts import fitting_ranges
from tinyvllm.protocol.messages import RequestOutput, StepOutputs
from tinyvllm.protocol.transport import send
from tinyvllm.scheduler.scheduler import Scheduler


def send_step_outputs(sock: zmq.Socket, sched: Scheduler, outputs: list[RequestOutput]) -> None:
    try:
        send(sock, StepOutputs(outputs, sched.stats(), time.time()))
        return
    except MessageTooLarge:
        pass  # split outside the handler: an error while splitting is not "during handling" of this one
    for msg in split_step_outputs(sched, outputs):
        send(sock, msg)


def too_large_error(limit: int) -> str:
    bound = f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit}-byte"
    return (f"the response would exceed the {bound} message bound between the engine's processes: ask for fewer "
            "prompt_logprobs or logprobs (or a shorter prompt)")


def split_step_outputs(sched: Scheduler, outputs: list[RequestOutput]) -> list[StepOutputs]:
    """`outputs` in as few StepOutputs as halving finds, each under the bound, with the stats as they are once every
    output too large alone was replaced (sched.end_with_error frees its request's blocks)."""
    outputs, now, replaced = list(outputs), time.time(), set()
    while True:
        stats = sched.stats()

        def part(lo: int, hi: int) -> StepOutputs:
            return StepOutputs(outputs[lo:hi], stats, now)

        ranges = fitting_ranges(len(outputs), lambda lo, hi: fits_in_a_message(part(lo, hi)))
        too_large = [lo for lo, hi in ranges if hi - lo == 1 and not fits_in_a_message(part(lo, hi))]
        if not too_large:
            return [part(lo, hi) for lo, hi in ranges]
        for i in too_large:
            if i in replaced:  # not even an ERROR output fits: a bound this small serves nothing
                raise MessageTooLarge("StepOutputs", len(codec.encode(part(i, i + 1))), codec.MAX_SEND_BYTES)
            outputs[i] = sched.end_with_error(outputs[i], too_large_error(codec.MAX_SEND_BYTES))
            replaced.add(i)
