"""What a model is and how it runs, known alike to the control plane, the agent and the clients:
weights sources, the hub, model files, sizing, and each engine's flag rules."""
