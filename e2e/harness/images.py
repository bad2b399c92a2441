"""What an image of this repository's ``images/`` defines for the fake kubelet: the ``ENV`` and
``ENTRYPOINT`` of its Dockerfile, which a container runtime would apply under the pod's own
command and env. Only the instructions themselves are read (no base image, no build).

``image_definition(ROOT / "images/sglang-worker/Dockerfile")`` gives ``ImageDefinition(env,
entrypoint)``; ``FakeKubelet.image_env[repo]`` and ``image_entrypoints[repo]`` take them.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImageDefinition:
    env: dict[str, str]
    entrypoint: list[str] | None


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def image_definition(dockerfile: Path) -> ImageDefinition:
    env: dict[str, str] = {}
    entrypoint: list[str] | None = None
    for word, rest in _instructions(dockerfile.read_text()):
        if word == "FROM":
            env, entrypoint = {}, None  # a later stage starts afresh
        elif word == "ENV":
            parts = shlex.split(rest)
            if parts and "=" not in parts[0]:  # the legacy form: ENV KEY value with spaces
                env[parts[0]] = rest.split(None, 1)[1] if len(parts) > 1 else ""
            else:
                for part in parts:
                    key, _, value = part.partition("=")
                    env[key] = value
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
    return ImageDefinition(env, entrypoint)
