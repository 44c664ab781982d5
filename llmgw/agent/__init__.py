"""The node agent: discovery, engines, weights, shard supervision and the stream."""
