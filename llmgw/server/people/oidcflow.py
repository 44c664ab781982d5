"""Signing a person in through the cluster's OpenID Connect provider: the authorisation
code flow with PKCE (authlib's client), then the ID token checked here (joserfc).

``begin`` reads the provider's discovery document (its ``issuer`` must be the one set),
makes a fresh ``state``, ``nonce`` and PKCE verifier, and answers the provider's URL to
send the browser to, with them sealed (the cluster's key) into a short-lived cookie: any
control plane of the cluster can finish the sign-in, and nothing is stored meanwhile.

``finish`` takes the provider's answer, in this order, and refuses at the first step
that fails (``SignInFailed``, its words for the person, its ``detail`` for the log,
which never holds a code, token or secret):

1. the provider's own error, if it sent one;
2. the sealed cookie opens, has not expired (10 minutes), and its ``state`` is the one
   sent back; each state is taken once (here, and the provider takes each code once);
3. the ``iss`` the provider sends back, when it does (RFC 9207), is the one set;
4. the code is exchanged, with the verifier and the client's secret;
5. the ID token's signature checks against the provider's keys (JWKS, read again once
   for a key it does not hold), and its issuer, audience (this client), expiry (one
   minute's leeway for clocks), issue time and ``nonce`` are the ones expected;
6. the person it names (``iss|sub``; their login is ``preferred_username``, else
   ``email``) is made or updated by ``PeopleService.sign_in``, with the grants their
   groups' claim gives through the group maps; a deactivated person is refused.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmgw import pki
from llmgw.server.people.oidcsettings import Oidc, OidcSettings
from llmgw.server.people.records import Person
from llmgw.server.people.service import Identity, PeopleService
from llmgw.server.refusal import Refusal
from llmgw.server.store import StoreError

if TYPE_CHECKING:
    # authlib, httpx and joserfc are loaded where a sign-in uses them: a control plane
    # without OIDC set up never holds them (docs/performance.md).
    from joserfc import jwt
    from joserfc.jwk import KeySet

log = logging.getLogger("llmgw.signin")

# The cookie that carries a sign-in from /admin/login/oidc to its callback.
PENDING_COOKIE = "llmgw_oidc"
PENDING_TTL = 600.0
# How long a provider's discovery document and keys are kept.
DISCOVERY_TTL = 300.0
HTTP_TIMEOUT = 10.0
LEEWAY = 60
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]

# What the person is told (the pages translate these words).
OFF = "Sign-in through an identity provider is not set up on this cluster."
UNREACHABLE = (
    "The identity provider could not be reached; try again, or sign in with the admin token."
)
STALE = "This sign-in was not started here, was already used, or took too long; start it again."
REFUSED = "The identity provider did not sign you in; nothing was changed."
UNCHECKED = "The identity provider's answer did not check out; nothing was signed in."
DEACTIVATED = "Your account on this cluster is deactivated; ask a cluster admin."
NO_LOGIN = "The identity provider named no user name or e-mail address for you."
UNRECORDED = (
    "This control plane cannot record your sign-in now (a standby, or its store is down); "
    "sign in at the leader, or try again."
)
# Claims whose wrong value the log may show (a nonce's it does not).
SHOWN_CLAIMS = ("iss", "aud", "azp", "sub")


class SignInFailed(Exception):
    """A sign-in refused: ``message`` for the person (one of the words above),
    ``detail`` for the log (never a secret)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(detail)
        self.message = message
        self.detail = detail
        # The login page's status: the provider down, sign-in off, or refused.
        self.status = (
            503 if message in (UNREACHABLE, UNRECORDED) else 404 if message == OFF else 401
        )


@dataclass(frozen=True)
class Discovered:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    keys: KeySet
    read_at: float


class OidcFlow:
    def __init__(
        self,
        settings: OidcSettings,
        people: PeopleService,
        cluster_secret: bytes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.people = people
        self._secret = cluster_secret
        self.clock = clock
        self._discovered: dict[str, Discovered] = {}
        # States taken here, each with when its cookie would have expired.
        self._taken: dict[str, float] = {}

    @property
    def button(self) -> str | None:
        """What the login page's button names ("Sign in with ..."); None when off."""
        now = self.settings.current
        return None if now is None else now.name

    # ------------------------------------------------------------------ begin

    async def begin(self, redirect_uri: str, back: str) -> tuple[str, str]:
        """The provider's URL to send the browser to, and the sealed cookie to set."""
        oidc = self._settings()
        found = await self._discover(oidc)
        state = secrets.token_urlsafe(24)
        nonce = secrets.token_urlsafe(24)
        verifier = secrets.token_urlsafe(48)
        from authlib.integrations.httpx_client import AsyncOAuth2Client

        client = AsyncOAuth2Client(
            oidc.client_id,
            scope=" ".join(oidc.scopes),
            redirect_uri=redirect_uri,
            code_challenge_method="S256",
        )
        try:
            url, _ = client.create_authorization_url(
                found.authorization_endpoint, state=state, nonce=nonce, code_verifier=verifier
            )
        finally:
            await client.aclose()
        pending = {
            "state": state,
            "nonce": nonce,
            "verifier": verifier,
            "redirect_uri": redirect_uri,
            "next": back,
            "issuer": oidc.issuer,
            "expires": self.clock() + PENDING_TTL,
        }
        cookie = pki.seal(self._secret, json.dumps(pending).encode())
        return str(url), cookie

    # ----------------------------------------------------------------- finish

    async def finish(
        self, query: Mapping[str, str], cookie: str | None, by: str
    ) -> tuple[Person, str]:
        """The person signed in, and where to send them next; else ``SignInFailed``."""
        oidc = self._settings()
        if "error" in query:
            error = query.get("error", "")[:100]
            raise SignInFailed(REFUSED, f"the provider answered error {error!r}")
        pending = self._open(cookie)
        now = self.clock()
        self._taken = {s: t for s, t in self._taken.items() if t > now}
        sent = query.get("state", "")
        if not secrets.compare_digest(sent.encode(), str(pending["state"]).encode()):
            raise SignInFailed(STALE, "the state sent back is not the one this sign-in sent")
        if sent in self._taken:
            raise SignInFailed(STALE, "this sign-in's state was already used (a replay)")
        self._taken[sent] = float(pending["expires"])
        if pending["issuer"] != oidc.issuer:
            raise SignInFailed(STALE, "the sign-in settings changed since this sign-in began")
        if "iss" in query and query["iss"] != oidc.issuer:
            raise SignInFailed(UNCHECKED, f"the answer came from issuer {query['iss'][:200]!r}")
        code = query.get("code", "")
        if not code:
            raise SignInFailed(REFUSED, "the provider sent back no code")
        found = await self._discover(oidc)
        id_token = await self._exchange(oidc, found, code, pending)
        claims = await self._check(oidc, found, id_token, str(pending["nonce"]))
        person = await self.person_of(oidc, claims, by)
        return person, str(pending["next"])

    def _open(self, cookie: str | None) -> dict[str, Any]:
        if not cookie:
            raise SignInFailed(STALE, "no sign-in cookie came back (another browser, or none)")
        try:
            pending = json.loads(pki.unseal(self._secret, cookie))
        except (pki.PKIError, ValueError) as exc:
            raise SignInFailed(STALE, f"the sign-in cookie does not open ({exc})") from None
        if not isinstance(pending, dict) or float(pending.get("expires", 0)) < self.clock():
            raise SignInFailed(STALE, "the sign-in took longer than 10 minutes")
        return pending

    async def _exchange(
        self, oidc: Oidc, found: Discovered, code: str, pending: Mapping[str, Any]
    ) -> str:
        import httpx
        from authlib.integrations.base_client.errors import OAuthError
        from authlib.integrations.httpx_client import AsyncOAuth2Client

        client = AsyncOAuth2Client(
            oidc.client_id,
            self.settings.client_secret(),
            redirect_uri=str(pending["redirect_uri"]),
            code_challenge_method="S256",
            timeout=HTTP_TIMEOUT,
        )
        try:
            token = await client.fetch_token(
                found.token_endpoint, code=code, code_verifier=str(pending["verifier"])
            )
        except OAuthError as exc:
            # A code used before is the provider's invalid_grant.
            raise SignInFailed(REFUSED, f"the token request was refused: {exc.error}") from None
        except httpx.HTTPError as exc:
            raise SignInFailed(
                UNREACHABLE, f"the token endpoint did not answer: {type(exc).__name__}"
            ) from None
        finally:
            await client.aclose()
        id_token = token.get("id_token") if isinstance(token, dict) else None
        if not isinstance(id_token, str):
            raise SignInFailed(UNCHECKED, "the token answer holds no ID token")
        return id_token

    async def _check(
        self, oidc: Oidc, found: Discovered, id_token: str, nonce: str
    ) -> dict[str, Any]:
        from joserfc import jwt
        from joserfc.errors import (
            ExpiredTokenError,
            InvalidClaimError,
            JoseError,
            MissingClaimError,
        )

        try:
            token = self._decode(id_token, found.keys)
        except JoseError:
            # The provider may have rolled its keys: read them once more.
            found = await self._discover(oidc, fresh=True)
            try:
                token = self._decode(id_token, found.keys)
            except JoseError as exc:
                raise SignInFailed(
                    UNCHECKED, f"the ID token's signature does not check: {exc.error}"
                ) from None
        claims = dict(token.claims)
        registry = jwt.JWTClaimsRegistry(
            now=lambda: int(self.clock()),
            leeway=LEEWAY,
            iss={"essential": True, "value": oidc.issuer},
            aud={"essential": True, "value": oidc.client_id},
            sub={"essential": True},
            exp={"essential": True},
            iat={"essential": True},
            nonce={"essential": True, "value": nonce},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise SignInFailed(UNCHECKED, "the ID token has expired") from None
        except (InvalidClaimError, MissingClaimError) as exc:
            value = claims.get(exc.claim) if exc.claim in SHOWN_CLAIMS else "..."
            said = f"{exc.claim} {str(value or '')[:200]!r}"
            raise SignInFailed(UNCHECKED, f"the ID token's claim is wrong: {said}") from None
        except JoseError as exc:
            raise SignInFailed(UNCHECKED, f"the ID token does not check: {exc.error}") from None
        audience = claims["aud"]
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != oidc.client_id:
            raise SignInFailed(UNCHECKED, "the ID token was given to another client (azp)")
        return claims

    @staticmethod
    def _decode(id_token: str, keys: KeySet) -> jwt.Token:
        from joserfc import jwt

        return jwt.decode(id_token, keys, algorithms=ALGORITHMS)

    async def person_of(self, oidc: Oidc, claims: Mapping[str, Any], by: str) -> Person:
        """Step 6: the person checked claims name, made or updated, with their grants."""
        login = str(claims.get("preferred_username") or claims.get("email") or "").strip()
        if not login:
            raise SignInFailed(NO_LOGIN, "the ID token has neither preferred_username nor email")
        groups_claim = claims.get(oidc.groups_claim)
        groups = [groups_claim] if isinstance(groups_claim, str) else groups_claim or []
        grants = self.settings.grants([str(g) for g in groups if isinstance(g, str | int)])
        who = Identity(
            source="oidc",
            subject=f"{claims['iss']}|{claims['sub']}",
            login=login,
            name=str(claims.get("name") or ""),
            email=str(claims.get("email") or ""),
        )
        try:
            person = await self.people.sign_in(who, grants, by)
        except Refusal as exc:
            raise SignInFailed(REFUSED, exc.message) from None
        except StoreError as exc:
            raise SignInFailed(UNRECORDED, f"{login} could not be written: {exc}") from None
        if person is None:
            raise SignInFailed(DEACTIVATED, f"{login} is deactivated")
        return person

    # -------------------------------------------------------------- discovery

    def _settings(self) -> Oidc:
        oidc = self.settings.current
        if oidc is None:
            raise SignInFailed(OFF, "OIDC sign-in is off")
        return oidc

    async def _discover(self, oidc: Oidc, fresh: bool = False) -> Discovered:
        """The provider's endpoints and keys, read at most every 5 minutes."""
        kept = self._discovered.get(oidc.issuer)
        if kept is not None and not fresh and self.clock() - kept.read_at < DISCOVERY_TTL:
            return kept
        where = f"{oidc.issuer}/.well-known/openid-configuration"
        import httpx
        from joserfc.errors import JoseError
        from joserfc.jwk import KeySet

        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as http:
                answer = await http.get(where)
                answer.raise_for_status()
                doc = answer.json()
                keys = await http.get(str(doc["jwks_uri"]))
                keys.raise_for_status()
                key_set = KeySet.import_key_set(keys.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError, JoseError) as exc:
            raise SignInFailed(
                UNREACHABLE, f"{where} did not answer a discovery document and keys: {exc}"
            ) from None
        if doc.get("issuer") != oidc.issuer:
            raise SignInFailed(
                UNCHECKED,
                f"the discovery document names issuer {str(doc.get('issuer'))[:200]!r}, "
                f"not {oidc.issuer!r}",
            )
        found = Discovered(
            issuer=oidc.issuer,
            authorization_endpoint=str(doc["authorization_endpoint"]),
            token_endpoint=str(doc["token_endpoint"]),
            jwks_uri=str(doc["jwks_uri"]),
            keys=key_set,
            read_at=self.clock(),
        )
        self._discovered[oidc.issuer] = found
        return found
