"""The OpenAI-compatible front door: pairs each request with a prefill and a decode sidecar."""
