"""The contract both sides of the engine import: the messages between frontend, scheduler and workers, their
codec and transport, and the model files every process reads (GGUF headers, config.json, model paths).

Nothing here imports tinygrad or the workers package, so the HTTP process can read a model without them.
"""
