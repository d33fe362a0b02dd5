"""Offline use of the same processes: `LLM(model).generate(prompts, sampling)`, `LLM.stream(prompt)`, `embed`, `score`.

A synchronous wrapper over the HTTP server's EnginePool (frontend/engine/engine_pool.py: EngineClients of one or more
data-parallel replicas, restarted when they fail): the pool runs on a private event loop in a background thread
(BackgroundLoop), and each call here blocks until that loop has its answer. Everything about the engine's protocol
(requests, aborts, outputs, a dead process) is EngineClient's.
"""
import asyncio
import atexit
import contextlib
import dataclasses
import itertools
import uuid
import weakref
from collections.abc import Iterator

from tinyvllm.frontend.engine import embeddings
from tinyvllm.frontend.engine.background_loop import BackgroundLoop
from tinyvllm.frontend.engine.beam_search import BeamSequence, beam_search
from tinyvllm.frontend.engine.detokenizer import IncrementalDetokenizer
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.engine_pool import EnginePool, launch_pool
from tinyvllm.frontend.engine.generation_result import CompletionOutput, GenerationResult, SampleCollector
from tinyvllm.frontend.engine.lora_adapters import LoRAAdapters
from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.frontend.engine.rerank import Reranker
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.sampling import BeamSearchParams, LoRARequest, SamplingParams

__all__ = ["LLM", "GenerationResult", "CompletionOutput", "LoRARequest"]

Prompt = str | list[int]  # text, or token ids


class LLM:
    def __init__(self, model: str | None = None, startup_timeout_s: float = 900.0, **engine_options):
        """engine_options: any engine knob by name (protocol/engine_config.py), e.g. max_num_seqs=8."""
        config = EngineConfig.of(model=model, **engine_options)
        engine = launch_pool(config)
        self.adapters = LoRAAdapters(engine.model_path, config.lora)
        self._start(engine, Tokenizer.from_model_path(engine.model_path), startup_timeout_s)

    def _start(self, engine: EnginePool, tokenizer, startup_timeout_s: float) -> None:
        """Starts `engine`'s processes and waits until it is ready."""
        self.tokenizer, self._engine = tokenizer, engine
        self._ids = itertools.count()
        self._loop = BackgroundLoop("tinyvllm-llm")
        # Closed by shutdown(), by garbage collection, or at exit.
        self._closer = weakref.finalize(self, _close, self._loop, engine)
        self._closer.atexit = False
        try:
            atexit.register(self._closer)
            self.ready = self._loop.run(engine.start(startup_timeout_s))
        except BaseException:
            self.shutdown()
            raise

    @property
    def stats(self) -> SchedulerStats:
        """The schedulers' latest (summed over data-parallel replicas), as of the last output read."""
        return self._engine.stats

    def generate(self, prompts: Prompt | list[Prompt], sampling: SamplingParams | list[SamplingParams] | None = None,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[GenerationResult]:
        """Runs every prompt, batched by the engine, and returns the results in prompt order.

        With SamplingParams.n > 1 a result holds all n samples in `outputs` (its `text` and `token_ids` are
        the first sample's). lora_request: the LoRA adapter (a PEFT folder) every prompt, or each, runs with
        (enable_lora=True); LoRAError if one does not fit the model. Raises EngineDeadError if an engine process
        dies meanwhile and no engine serves (with data-parallel replicas, the requests a failed one held end with
        an error instead)."""
        prompts = _as_list(prompts)
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        adapters = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if lora_request is not None:
            params = [dataclasses.replace(sp, lora=adapter) for sp, adapter in zip(params, adapters, strict=True)]
        for sp in params:
            self._check(sp)
        prompt_ids = [self._prompt_ids(p) for p in prompts]
        collectors = [SampleCollector(sp.n) for sp in params]
        self._loop.run(self._collect(list(zip(prompt_ids, params, collectors))))
        return [c.result(ids, self.tokenizer) for ids, c in zip(prompt_ids, collectors)]

    async def _collect(self, requests: list[tuple[list[int], SamplingParams, SampleCollector]]) -> None:
        async def one(ids: list[int], sampling: SamplingParams, collector: SampleCollector) -> None:
            async for out in self._engine.generate(self._request_id(), ids, sampling, self.tokenizer.eos_token_ids):
                collector.add(out)

        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels (and so aborts) the rest
                for request in requests:
                    group.create_task(one(*request))
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from None
        if self._engine.dead_reason is not None:  # the requests ended with its error outputs
            raise EngineDeadError(self._engine.dead_reason)

    def beam_search(self, prompt: Prompt, params: BeamSearchParams) -> list[BeamSequence]:
        """The best params.beam_width beams of the prompt (frontend/engine/beam_search.py), best first; ValueError for a
        width or length out of bounds."""
        params.validate()
        ids = self._prompt_ids(prompt)
        return self._loop.run(beam_search(self._engine, self._request_id(), ids, params,
                                          self.tokenizer.eos_token_ids))

    def embed(self, texts: Prompt | list[Prompt]) -> list[list[float]]:
        """One vector per input: the model's final hidden states (after the final norm) mean-pooled over the
        input's tokens, then L2-normalised (frontend/engine/embeddings.py says more)."""
        ids = [self._prompt_ids(text) for text in _as_list(texts)]
        try:
            return self._loop.run(embeddings.embed(self._engine, ids))
        except EngineRequestError as e:
            raise RuntimeError(str(e)) from None

    def score(self, query: str, documents: str | list[str], instruction: str | None = None) -> list[float]:
        """Each document's relevance to the query as /v1/rerank scores it (frontend/engine/rerank.py): a decoder-only
        reranker's P("yes") against P("no"); ValueError for a pair longer than the context."""
        reranker = Reranker(self._engine, self.tokenizer, self.ready.max_model_len)
        try:
            return self._loop.run(reranker.score([(query, d) for d in _as_list(documents)], instruction,
                                                 "documents"))[0]
        except EngineRequestError as e:
            raise RuntimeError(str(e)) from None

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None) -> Iterator[str]:
        """Yields the text as it is generated (one sample: n must be 1); closing the generator early aborts the
        request."""
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ValueError("stream() yields one text: use generate() for n > 1")
        self._check(sampling)
        ids = self._prompt_ids(prompt)
        detok = IncrementalDetokenizer(self.tokenizer, ids)
        outputs = self._engine.generate(self._request_id(), ids, sampling, self.tokenizer.eos_token_ids)
        with contextlib.closing(self._loop.iterate(outputs)) as steps:
            for out in steps:
                if text := detok.add(out.new_token_ids):
                    yield text
                if out.error:
                    raise RuntimeError(out.error)
        if tail := detok.flush():
            yield tail

    def shutdown(self) -> None:
        """Stops the engine's processes and the background loop; requests still open are aborted."""
        atexit.unregister(self._closer)
        self._closer()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _check(self, sampling: SamplingParams) -> None:
        sampling.validate()
        if sampling.lora is not None:
            self.adapters.check(sampling.lora)

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def _request_id(self) -> str:
        return f"llm-{next(self._ids)}-{uuid.uuid4().hex[:8]}"


def _as_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return prompts


def _close(loop: BackgroundLoop, engine: EnginePool) -> None:
    """Aborts what is still open, tells the schedulers to stop (EnginePool.close), waits for the processes,
    then stops the loop. Holds no reference to the LLM, so that it can run when the LLM is collected."""
    try:
        loop.cancel_pending()
        loop.run(engine.close())
    finally:
        engine.stop_processes()
        loop.close()
