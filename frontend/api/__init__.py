"""The HTTP server: OpenAI's routes, Ollama's (ollama/), /metrics, /dashboard, admission and deadlines."""
