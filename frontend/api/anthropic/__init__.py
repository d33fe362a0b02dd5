"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as a layer over the OpenAI chat path."""
