"""Decoder-only reranking, as Qwen3-Reranker does it: each (query, document) pair becomes a prompt in the model's
chat template that asks whether the document meets the query, and its relevance is the probability of "yes"
against "no" at the prompt's last position: softmax(logit_no, logit_yes)[1] (vLLM serves the same model as a
classifier of weight w_yes - w_no and a sigmoid: the same number). The pairs run as prefill-only scoring requests
(frontend/engine/embeddings.score_tokens), batched by the engine like any other prompts; their common beginning
(the template and instruction) comes from the prefix cache after the first."""
import asyncio
import math
from dataclasses import dataclass

from tinyvllm.frontend.engine.embeddings import score_tokens

JUDGE = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
         'Note that the answer can only be "yes" or "no".')
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def ranked(scores: list[float], top_n: int) -> list[int]:
    """The documents' indices, most relevant first (ties in input order); the first top_n, or all if it is 0."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n else order


class RerankError(ValueError):
    """Input the model cannot score (a message fit for an HTTP 400); `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Reranker:
    engine: object
    tokenizer: object  # protocol.tokenizer.Tokenizer
    max_model_len: int

    def answer_token_ids(self) -> list[int]:
        """The ids of "no" and "yes", single tokens of the vocabulary (as the model card reads them)."""
        ids = [self.tokenizer.token_to_id(word) for word in ("no", "yes")]
        if None in ids:
            raise RerankError('this model cannot rerank: its vocabulary has no "yes" or no "no" token')
        return ids

    def prompt_ids(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        user = f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        if not self.tokenizer.chat_template:
            return self.tokenizer.encode(f"{JUDGE}\n{user}\nAnswer (yes or no): ", True)
        # Qwen3's template with the thinking off ends in an empty think block, as the model card's prompt does; a
        # template without a system turn (Gemma's raises) gets the judge's words in the user's
        for messages in ([{"role": "system", "content": JUDGE}, {"role": "user", "content": user}],
                         [{"role": "user", "content": f"{JUDGE}\n{user}"}]):
            try:
                text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
                return self.tokenizer.encode(text, False)
            except ValueError as e:
                error = e
        raise RerankError(f"this model's chat template cannot render a rerank prompt: {error}")

    def prompts(self, pairs: list[tuple[str, str]], instruction: str | None, param: str) -> list[list[int]]:
        """Each (query, document) pair's prompt; RerankError at the first one longer than the model's context."""
        batch = []
        for query, document in pairs:
            batch.append(ids := self.prompt_ids(query, document, instruction))
            if len(ids) > self.max_model_len:
                raise RerankError(f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                  f"a query and document take {len(ids)} tokens. Please reduce the length of the "
                                  f"input.", param)
        return batch

    async def score(self, pairs: list[tuple[str, str]], instruction: str | None,
                    param: str) -> tuple[list[float], int]:
        """(each pair's relevance, the prompts' tokens together); the prompts are rendered and tokenized off the event
        loop (a long query times many documents is seconds of it)."""
        no_yes = self.answer_token_ids()
        batch = await asyncio.to_thread(self.prompts, pairs, instruction, param)
        logits = await score_tokens(self.engine, batch, no_yes)
        return [1.0 / (1.0 + math.exp(max(-700.0, min(700.0, no - yes)))) for no, yes in logits], \
            sum(len(ids) for ids in batch)
