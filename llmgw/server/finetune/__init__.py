"""Fine-tune jobs: a LoRA adapter trained on a node from a model's base weights and
the user's pairs, kept in the store and served as the model's adapter."""
