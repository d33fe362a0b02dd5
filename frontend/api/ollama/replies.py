"""Ollama's response bodies as /openapi.json describes them (the routes build them as dicts; the schemathesis
tests check every answer against these). Durations are integer nanoseconds."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class Durations(BaseModel):
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class GenerationReply(Durations):
    model: str
    created_at: str
    done: bool
    done_reason: str | None = None
    context: list[int] | None = None


class GenerateReply(GenerationReply):
    response: str


class ReplyMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatReply(GenerationReply):
    message: ReplyMessage


class EmbedReply(Durations):
    model: str
    embeddings: list[list[float]]


class EmbeddingsReply(BaseModel):
    embedding: list[float]


class RerankedDocument(BaseModel):
    index: int
    document: str
    relevance_score: float


class RerankReply(BaseModel):
    model: str
    results: list[RerankedDocument]


class ModelDetails(BaseModel):
    parent_model: str
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ModelSummary(BaseModel):
    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails


class TagsEntry(ModelSummary):
    modified_at: str


class PsEntry(ModelSummary):
    expires_at: str
    size_vram: int
    context_length: int


class TagsReply(BaseModel):
    models: list[TagsEntry]


class PsReply(BaseModel):
    models: list[PsEntry]


class OllamaVersion(BaseModel):
    version: str


class ShowReply(BaseModel):
    license: str
    modelfile: str
    parameters: str
    template: str
    system: str | None = None
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class StatusReply(BaseModel):
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None
