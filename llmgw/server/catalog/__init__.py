"""The models: the catalog, the service that changes it, the reconciler and scheduler that make it
so, and the planner with its inspector."""
