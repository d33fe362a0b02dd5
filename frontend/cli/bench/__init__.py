"""`tinyvllm bench serve` (a load generator for any OpenAI-compatible server) and `tinyvllm bench throughput`
(offline, through the `LLM` API), modelled on vLLM's `vllm bench serve` and `vllm bench throughput`."""
