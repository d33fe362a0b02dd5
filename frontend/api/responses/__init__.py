"""OpenAI's Responses API (/v1/responses) as a layer over the chat path."""
