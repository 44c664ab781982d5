"""``llmgw wipe``: take llmgw off a machine, after listing exactly what goes.

``finding`` works out what llmgw left on a machine (units, processes it started, its
nftables table, its files), ``removal`` takes away exactly that, ``machine`` is the seam
to what is not a file (systemd, nft, processes: the host's, or none for a scratch root),
and ``command`` is the command line: list, confirm with the machine's name, remove,
report.
"""
