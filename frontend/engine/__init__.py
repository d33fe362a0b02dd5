"""The engine's control side: start its processes, send them requests, read their outputs, restart them."""
