"""Whether a process is still running: for the local stack's orphan checks and the shm
transport's sweep of arenas that SIGKILLed sidecars left behind."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Running. A zombie nobody has reaped yet counts as gone; another user's process (which
    we may not signal) counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which may itself hold spaces and parentheses.
    return text.rsplit(")", 1)[1].split()[0] != "Z"
