"""Fine-tuning on a node: the trainer's Python environment and llama.cpp's conversion
scripts (``trainenv``), the trainer script run in that environment (``trainer.py``,
never imported by llmgw), and the runner that runs it for a fine-tune job."""
