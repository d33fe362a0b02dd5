"""tinyvllm's frontend: the HTTP server, the CLI and the offline `LLM` API (exported as `tinyvllm.LLM`)."""
