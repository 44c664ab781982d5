"""Offline installs: bundles of an llmgw release, the pinned engine builds and model
files (``bundle``, ``bundleimport``), and the mirror a control plane fills from them and
serves to its nodes (``manifest`` holds the layout both share)."""
