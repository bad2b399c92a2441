"""An idle SGLang scheduler with ``--sleep-on-idle`` waits in its ``IdleSleeper``'s zmq poll;
FluidRole's commands arrive on another thread and must end that wait (``idle_wake``). Run in
SGLang's own interpreter against SGLang 0.5.17's real ``IdleSleeper`` and a real zmq socket:
the patched scheduler class registers the wake pipe in the sleeper's poller, a wake makes the
poll report it, the scheduler's idle wait empties it again, and a submitted FluidRole command
wakes it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fluidpd_sidecar.sglang.server import PACKAGE_ROOT

SCRIPT = """
import json, threading
import zmq
from sglang.srt.managers.scheduler_components.idle_sleeper import IdleSleeper
from fluidpd_sidecar.sglang import idle_wake, roleswitch

ctx = zmq.Context()
tokenizer = ctx.socket(zmq.PULL)
tokenizer.bind("inproc://tokenizer")

class Scheduler:  # the two members idle_wake patches, as SGLang's Scheduler has them
    def __init__(self, sleeper):
        self.idle_sleeper = sleeper
    def maybe_sleep_on_idle(self):
        self.idle_sleeper.maybe_sleep()

class NoSleeper(Scheduler):
    'Launched without --sleep-on-idle: SGLang makes no sleeper.'

idle_wake.install(Scheduler)
idle_wake.install(NoSleeper)
s = Scheduler(IdleSleeper([tokenizer]))
NoSleeper(None)
r, _ = idle_wake._fds()
out = {}
out["idle"] = dict(s.idle_sleeper.poller.poll(0)).get(r, 0)
idle_wake.wake()
idle_wake.wake()
out["woken"] = dict(s.idle_sleeper.poller.poll(0)).get(r, 0)
s.maybe_sleep_on_idle()  # returns at once: the pipe is readable
out["after_wait"] = dict(s.idle_sleeper.poller.poll(0)).get(r, 0)
# A FluidRole command from the hook's HTTP thread wakes the sleeping loop thread.
t = threading.Thread(target=roleswitch.submit, args=("unstarted", {}, 0.01))
t.start(); t.join()
out["command"] = dict(s.idle_sleeper.poller.poll(0)).get(r, 0)
out["pollin"] = zmq.POLLIN
print(json.dumps(out))
"""


def test_a_wake_ends_the_idle_wait_and_is_emptied_by_it(sglang_python: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sglang_python, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": str(PACKAGE_ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["idle"] == 0  # registered, nothing to read
    assert got["woken"] == got["pollin"]
    assert got["after_wait"] == 0
    assert got["command"] == got["pollin"]
