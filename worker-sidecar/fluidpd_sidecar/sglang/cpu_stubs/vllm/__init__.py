"""Stand-in for the one ``vllm`` symbol SGLang 0.5.17 imports on CPU (see ``_custom_ops``).

On ``PYTHONPATH`` only for CPU servers (``fluidpd_sidecar.sglang.server``); never on a GPU.
"""
