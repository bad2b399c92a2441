"""The FluidRole controller outside Kubernetes (`fluidpd controller`); the operator hosts the
same class."""
