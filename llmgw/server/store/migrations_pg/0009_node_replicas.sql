-- The replicas each node's agent last reported Ready (JSON: a list of shard statuses as
-- the wire writes them), so that a control plane started while engines run routes to
-- them, once each engine answers its probe, until the node's agent reports again.
ALTER TABLE nodes ADD COLUMN replicas TEXT NOT NULL DEFAULT '[]';
