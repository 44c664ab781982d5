-- The leader's lease: the control plane named `holder` leads until `expires_at` (the
-- server's clock, seconds since the epoch) unless it renews; another takes it once it
-- expired, with the term one higher. Every write of a leading control plane checks, in
-- its transaction, that it still holds the lease with its term.
CREATE TABLE leader_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT,
    term BIGINT NOT NULL DEFAULT 0,
    expires_at DOUBLE PRECISION NOT NULL DEFAULT 0
);
INSERT INTO leader_lease (id) VALUES (1);
