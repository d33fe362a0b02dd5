"""With `tinyvllm router --tokenizer MODEL`: a request's prompt keyed as the instances key their prefix caches, the
chained hashes of its full KV blocks of token ids (protocol/block_hash.py), so the instances' KV events
(kv_event_streams.py) say which of them holds it, whichever router replica sent it there.

The prompt is rendered and tokenized by the instances' own code (frontend/api/serving.py's RequestServing, on the
same model's tokenizer and chat template), for OpenAI completions and chat, the requests whose rendering depends
only on the body. Any other request, or one the instance would refuse, is keyed by its text (prompt_chunks.py), as
without --tokenizer; the instance judges it.
"""
import json
import logging
from collections.abc import Callable

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.reasoning import reasoning_format
from tinyvllm.frontend.api.serving import RequestServing
from tinyvllm.frontend.engine.replica_router import prompt_block_hashes
from tinyvllm.frontend.router.prompt_chunks import request_chunk_hashes
from tinyvllm.protocol.tokenizer import Tokenizer

log = logging.getLogger("tinyvllm.router")
PARSERS = {"/v1/completions": (api.parse_completion_request, False),
           "/v1/chat/completions": (api.parse_chat_request, True)}  # path -> (its parser, whether it is a chat)


class TokenizedPrompts:
    def __init__(self, model: str, block_size: Callable[[], int]):
        """model: what `serve --model` names (a .gguf file, a Hugging Face folder); block_size: the instances' KV
        block size, as their KV events report it."""
        tokenizer = Tokenizer.from_model_path(model)
        self.serving = RequestServing(None, tokenizer, 0, None,
                                      reasoning=reasoning_format(None, tokenizer.chat_template))
        self.block_size = block_size

    async def hashes(self, path: str, raw_body: bytes) -> list[bytes]:
        parser = PARSERS.get(path)
        if parser is None:
            return request_chunk_hashes(raw_body)
        parse, is_chat = parser
        try:
            ids = await self.serving.prompt_token_ids(parse(json.loads(raw_body)), is_chat)
        except Exception as e:  # a body the instance will refuse, in whatever way: it answers, the routing only guesses
            log.debug("keyed %s by its text: %r", path, e)
            return request_chunk_hashes(raw_body)
        return prompt_block_hashes(ids, self.block_size())
