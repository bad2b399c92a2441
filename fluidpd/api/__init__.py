"""HTTP-facing models: the sidecar's internal protocol and the OpenAI-compatible surface."""
