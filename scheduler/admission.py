"""Whether a request can ever be served: checked once, when it arrives (messages fit for an HTTP 400)."""
from tinyvllm.scheduler.parallel_sampling import child_id
from tinyvllm.scheduler.request import Request

MAX_TOKEN_ID = 2**31 - 1  # workers hold token ids as int32


def admission_error(req: Request, ids_in_use, max_model_len: int, block_size: int, num_blocks: int,
                    blocks_per_request: int | None = None) -> str | None:
    """Why req must be refused, or None. ids_in_use: a container of every request and parent id still live.
    blocks_per_request: the most a request holds at once, if less than its length needs (a sliding window; not for
    a request whose prompt's KV moves to or from another instance: all of it is held)."""
    try:
        req.sampling.validate()
    except ValueError as e:
        return str(e)
    n = req.sampling.n
    if any(req_id in ids_in_use for req_id in [req.req_id] + [child_id(req.req_id, i) for i in range(n if n > 1 else 0)]):
        return f"request id {req.req_id!r} is already in use"
    if not req.prompt_token_ids:
        return "the prompt is empty"
    if min(req.prompt_token_ids) < 0 or max(req.prompt_token_ids) > MAX_TOKEN_ID:
        return f"prompt token ids must be between 0 and {MAX_TOKEN_ID}"
    num_prompt = req.num_prompt_tokens
    if req.sampling.pools and num_prompt > max_model_len:
        return f"the input has {num_prompt} tokens but max_model_len is {max_model_len}"
    if num_prompt >= max_model_len and not req.sampling.pools:
        return (f"the prompt has {num_prompt} tokens but max_model_len is {max_model_len}, "
                f"which leaves no room to generate")
    num_needed = -(-num_prompt // block_size)
    blocks_per_request = None if req.kv_transfer else blocks_per_request
    if blocks_per_request is not None and blocks_per_request > num_blocks:
        return (f"a request may hold {blocks_per_request} KV cache blocks of {block_size} tokens at once (its sliding "
                f"window and a chunk of new tokens), but the whole cache only has {num_blocks} blocks")
    if num_needed > num_blocks and blocks_per_request is None:
        return (f"the prompt has {num_prompt} tokens and needs {num_needed} KV cache blocks of {block_size} tokens, "
                f"but the whole cache only has {num_blocks} blocks ({num_blocks * block_size} tokens)")
    return None

