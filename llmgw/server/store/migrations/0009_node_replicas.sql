-- The replicas each node's agent last reported Ready (JSON: a list of shard statuses as
-- the wire writes them), so that a control plane started while engines run routes to
-- them, once each engine answers its probe, until the node's agent reports again.
ALTER TABLE nodes ADD COLUMN replicas TEXT NOT NULL DEFAULT '[]';

-- Change capture (0005) writes every column: the row's view again, with the new one.
DROP VIEW change_row_nodes;
CREATE VIEW change_row_nodes AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'address', address,
        'state', state,
        'state_reason', state_reason,
        'cert_serial', cert_serial,
        'version', version,
        'facts', facts,
        'enrolled_at', CASE typeof(enrolled_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', enrolled_at), 'Inf', '9e999')) ELSE enrolled_at END,
        'registered_at', CASE typeof(registered_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', registered_at), 'Inf', '9e999')) ELSE registered_at END,
        'last_seen', CASE typeof(last_seen) WHEN 'real'
            THEN json(replace(printf('%!.17g', last_seen), 'Inf', '9e999')) ELSE last_seen END,
        'cordoned', CASE typeof(cordoned) WHEN 'real'
            THEN json(replace(printf('%!.17g', cordoned), 'Inf', '9e999')) ELSE cordoned END,
        'draining', CASE typeof(draining) WHEN 'real'
            THEN json(replace(printf('%!.17g', draining), 'Inf', '9e999')) ELSE draining END,
        'labels', labels,
        'replicas', replicas
    ) AS row
FROM nodes;
