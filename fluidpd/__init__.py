"""FluidPD: SLO-aware prefill/decode disaggregated LLM serving with in-place elasticity."""

__version__ = "0.1.0"
