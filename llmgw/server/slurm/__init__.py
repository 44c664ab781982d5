"""Slurm beside llmgw: the files it runs on, and the nodes lent to it and taken back."""
