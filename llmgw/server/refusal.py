"""The one way a service of the control plane says no.

Services (the catalog, keys, the fleet) raise ``Refusal`` with an HTTP-style status, a
code scripts can test, a message a person can act on and, when one value is to blame,
the field that holds it. The edges turn it into their own answer (the admin API's
JSON, a console dialog); the services never build an answer themselves.
"""

from __future__ import annotations


class Refusal(Exception):
    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, **details: object
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        # Beside the message for scripts (per-node verdicts, say), which it says in words.
        self.details = details

    def as_json(self) -> dict[str, dict[str, object]]:
        body: dict[str, object] = {
            "type": self.code,
            "message": self.message,
            "code": self.code,
            "param": self.field,
        }
        if self.field is not None:
            body["field"] = self.field
        body.update(self.details)
        return {"error": body}


def not_found(message: str) -> Refusal:
    return Refusal(404, "not_found", message)


def bad_request(message: str, field: str | None = None) -> Refusal:
    return Refusal(400, "bad_request", message, field)
