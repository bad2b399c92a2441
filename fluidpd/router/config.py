"""The router's settings (from ``fluidpd router``'s command line)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouterConfig:
    model: str
    context_limit: int
    workers: dict[str, str]
    admin_token: str | None = None
    pairing: str = "round-robin"
    first_token_timeout_s: float = 60.0
    poll_s: float = 0.5
    #: Default max_tokens when a request gives none (OpenAI's completions default is 16).
    default_max_tokens: int = 16
