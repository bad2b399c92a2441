"""The ``gpu`` engine: a decoder-only transformer served with torch (issues #5, #12).

SGLang cannot run on the machines this project has (see issue #5), so this package is our own
small serving engine with the same engine interface as ``sim``: Llama / Qwen3 shapes and
``config.json`` (``config``), a Hugging Face model directory's weights (``checkpoint``) or seeded
ones (``model``), a paged KV cache (``kvcache``), SDPA prefill/extend and a Triton paged decode
kernel (``attention``), CUDA-graph decode (``runner``), batched sampling (``sampling``), the KV
wire format (``wire``) and the ``Engine`` adapter (``engine``).

torch is imported only by the submodules, so ``import fluidpd_sidecar`` stays light.
"""
