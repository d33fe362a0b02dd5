"""tinyvllm's frontend, in three layers that import only downwards (tests/protocol/test_import_layers.py):

- engine/: the engine's control side: starting its processes (launcher), talking to them (engine_client), replicas
  and routing between them (engine_pool, replica_router), and the offline `LLM` API (exported as `tinyvllm.LLM`).
- api/: the HTTP server on top of an engine: OpenAI's and Ollama's routes, metrics, the dashboard, admission.
- cli/: the `tinyvllm` command (serve, worker, run, bench, ...).

router/ (`tinyvllm router`) sits beside api/: an HTTP app over many servers, using the engine's replica routing.
"""
