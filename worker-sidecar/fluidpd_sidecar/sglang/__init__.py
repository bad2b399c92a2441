"""The ``sglang`` engine backend: the sidecar supervises one SGLang server per worker.

SGLang runs in its own interpreter and virtual environment (``scripts/sglang/mkvenv.sh``):
it pins libraries FluidPD does not. ``launch`` is our entry point in that interpreter; it loads
``hook`` (and through it ``fluidtoken_hook``, the decode side's suffix extend) into SGLang's
scheduler process and then runs SGLang's own server. ``hook``, ``fluidtoken_hook`` and
``launch`` import only the standard library and SGLang (never ``fluidpd``), so this package's
``__init__`` must stay import-free too. ``fluidtoken`` is FluidToken's sidecar side;
``server`` (supervision) and ``observe`` (reading the hook) run in the sidecar's own interpreter.
"""
