"""Slurm beside llmgw: its configuration, the nodes lent to it, lending by policy."""
