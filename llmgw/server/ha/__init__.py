"""Control planes: leadership, standbys, replication."""
