"""The OpenAI-style response bodies as /openapi.json describes them (the bodies themselves are built as dicts by
frontend/api/openai_protocol.py and the routes; the schemathesis tests check every answer against these)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Choice(BaseModel):
    index: int
    logprobs: Any = None
    finish_reason: str | None
    stop_reason: str | int | None = None


class CompletionChoice(Choice):
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Choice):
    message: AssistantMessage


class Envelope(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage


class CompletionResponse(Envelope):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class ChatResponse(Envelope):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None  # null for a stored model that runs on other weights than the served one


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Embedding(BaseModel):
    index: int
    object: Literal["embedding"]
    embedding: list[float] | str  # a string with encoding_format base64


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class RerankDocumentText(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocumentText | None = None  # with return_documents
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class Score(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[Score]
    usage: EmbeddingUsage


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class OpenAPIDocument(BaseModel):
    openapi: str
    info: dict
    paths: dict
