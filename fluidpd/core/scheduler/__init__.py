"""The per-worker scheduler shared by every harness (simulator, sidecar, GPU backend).

One file per side, as in SGLang's ``srt/disaggregation``: ``prefill.py`` (FIFO, one request per
batch, waits for the decode side's KV reservation, runs Algorithm 1), ``decode.py`` (KV
admission, continuous batching, stolen-suffix extends, drains), ``worker.py`` (one worker
that holds both sides and switches role in place), ``messages.py`` (what workers tell each
other and the outside world through their outbox).

A harness drives a worker with a plan/execute/complete cycle: ``next_batch(now)`` returns the
work to run (with its predicted duration), the harness executes it (sleeps in the simulator,
runs a forward pass on a GPU) and calls ``finish_batch(batch, now, measured)``. Everything a
worker wants to tell others lands in ``worker.outbox``; the harness delivers it.
"""
