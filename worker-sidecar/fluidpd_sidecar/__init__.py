"""FluidPD worker sidecar: one process per worker, owning one engine and the shared scheduler.

It drives ``fluidpd.core.scheduler.Worker`` with a real clock (``time.time()``; arrivals
come from the router on the same clock), runs the engine for every batch the scheduler
plans, and delivers the scheduler's messages to peer sidecars and the router over HTTP.
"""
