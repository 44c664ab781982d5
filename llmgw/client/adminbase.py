"""The admin API's client, its plumbing (``AdminBase``): one request with the token, a
stream of newline-delimited JSON, and a ``Route``'s answer read as its shape. The calls
themselves are ``AdminClient``'s (``admin.py``) and ``PeopleCalls``' (``adminpeople.py``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

from llmgw.client.routes import Body, Query, Route, T


class AdminError(RuntimeError):
    """The admin API could not be reached or refused; the message says why. A refusal
    also carries its HTTP status and its error's ``type`` (``not_found``,
    ``authorization_pending``, ...)."""

    def __init__(self, message: str, kind: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class AdminBase:
    """The calls' plumbing: one request, a stream, a route's typed answer."""

    base_url: str
    token: str
    timeout: float = 10.0

    def request(
        self, method: str, path: str, body: Body | None = None, timeout: float | None = None
    ) -> object:
        """The decoded JSON answer of one call (null for an empty one), waited for
        ``timeout`` seconds (the client's own when not given)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"authorization": f"Bearer {self.token}", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            kind = None
            try:
                said = json.loads(exc.read())["error"]
                message = said["message"]
                kind = str(said.get("type")) if said.get("type") else None
            except (ValueError, KeyError, TypeError, AttributeError):
                message = f"HTTP {exc.code}"
            raise AdminError(f"{self.base_url}{path}: {message}", kind, exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the control plane at {self.base_url}: {reason}; is "
                "`llmgw server run` running there?"
            ) from exc

    def stream(self, path: str) -> Iterator[object]:
        """Newline-delimited JSON from a GET, one value at a time, as it arrives."""
        req = urllib.request.Request(
            self.base_url + path, headers={"authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=None) as resp:
                for line in resp:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as exc:
            raise AdminError(f"{self.base_url}{path}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(f"lost the control plane at {self.base_url}: {exc}") from exc

    def get(self, path: str) -> object:
        return self.request("GET", path)

    def post(self, path: str, body: Body) -> object:
        return self.request("POST", path, body)

    def call(
        self,
        route: Route[T],
        *parts: str,
        body: Body | None = None,
        query: Query | None = None,
        timeout: float | None = None,
    ) -> T:
        """``route``'s answer, as its shape. A POST without a body sends ``{}``;
        ``timeout``: for a call known to take longer than the client's own wait."""
        if route.method == "POST" and body is None:
            body = {}
        at = route.at(*parts, query=query)
        if timeout is None:
            return route.read(self.request(route.method, at, body))
        return route.read(self.request(route.method, at, body, timeout))
