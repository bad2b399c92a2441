"""The FluidPD Kubernetes operator (kopf): FluidPDDeployment -> worker pods, per-role Services,
router; in-place role switches driven by the core's FluidRole policy; capacity fallback."""
