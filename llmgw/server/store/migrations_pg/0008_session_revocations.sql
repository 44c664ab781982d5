-- Admin page sessions signed out before they would have ended (server/sessions.py, Revocations).
-- Every control plane reads this list (standbys every second), so a signed-out cookie
-- is refused everywhere. A row is of no use once its session would have ended
-- (`expires_at`): signing out removes those, so the list holds at most the sessions
-- signed out in the last 12 hours.
CREATE TABLE session_revocations (
    sid TEXT PRIMARY KEY,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION NOT NULL
);
