"""The control plane: store, admin API, gateway, and the agents' port."""
