"""The ``gpu`` engine: a decoder-only transformer served with torch (issue #5).

SGLang cannot run on the machines this project has (see the issue), so this package is our own
small serving engine with the same engine interface as ``sim``: Llama-3.1 / Qwen3 shapes
(``config``), seeded or safetensors weights (``weights``), a paged KV cache (``kvcache``),
SDPA prefill/extend and a Triton paged decode kernel (``attention``), CUDA-graph decode
(``runner``), the KV wire format (``wire``) and the ``Engine`` adapter (``engine``).

torch is imported only by the submodules, so ``import fluidpd_sidecar`` stays light.
"""
