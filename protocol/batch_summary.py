"""What the scheduler says about each request of its running batch, for the dashboard (frontend/api/dashboard.py).

Sent with every step's stats, so it is bounded: at most MAX_SUMMARIZED_REQUESTS requests (the oldest of the batch)
and request ids cut to MAX_REQUEST_ID_CHARS. SchedulerStats.num_running still counts them all.
"""
from dataclasses import dataclass

MAX_SUMMARIZED_REQUESTS = 64
MAX_REQUEST_ID_CHARS = 48


@dataclass(slots=True)
class RunningRequestSummary:
    req_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_blocks: int  # KV blocks it holds (shared prefix-cache blocks count for every holder)
