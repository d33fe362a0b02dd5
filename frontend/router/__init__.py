"""`tinyvllm router`: one address in front of many `tinyvllm serve` instances.

instance_registry (who is there, and which may take requests), instance_picker (which one takes a request: least
loaded or holding its prefix, through frontend/engine/replica_router.py), prompt_chunks (a request's prompt as hashable
chunks), upstream_proxy and stream_framing (forwarding a request and streaming its answer back), instance_monitor
and dns_discovery (health checks, heartbeat expiry, DNS), membership_routes (/instances), router_metrics
(/metrics), app (the Starlette app), command (`tinyvllm router`'s flags and its process).
"""
