"""The one-line-error JSONL reader the rerun and summary scripts of ``tried-s30/`` and
``tried-s31/`` share."""

from __future__ import annotations

import json
import sys
from typing import Any


def read_rows(path: str, label: str) -> list[Any]:
    """The JSON rows of the JSONL file ``path``, or a one-line error naming ``label`` (the
    argument it came from) and exit 1."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{label}: cannot read {path}: {e}")
