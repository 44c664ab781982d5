"""Guard policies: what reads a key's prompts and tool calls, kept in the store's
settings as one JSON document (``guard``: ``{"policies": [...]}``), as slurm's and
ldap's are. Every control plane holds them in memory (``KeptPolicies``) and reads them
again when its copy of the settings table changes.

A policy names its judge (a model of the catalog, asked through the gateway's own
router), what an instruction found in a text does (``injection``: block or flag), what
personal data does (``pii``: redact, block or flag), how long a judgment may take
(``wait_ms``) and what a judgment that misses it does (``fail``: closed refuses, open
lets through flagged).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from llmgw.jsonvalue import JSONObject
from llmgw.server.principal import Principal
from llmgw.server.schema import spec
from llmgw.server.store import Store

SETTING = "guard"
POLICY_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
POLICY_WORDS = "lower-case letters, digits, '_' or '-', up to 32, starting with a letter or digit"
# A judge asked of every prompt adds its time to each: two seconds leaves a small judge
# (1-2B parameters) on a card room for a 4,000-token prompt, and bounds what a busy or
# slow judge can add to a request. A CPU judge needs more (``ctl guard judge check``).
DEFAULT_WAIT_MS = 2000
MAX_WAIT_MS = 60_000
Injection = Literal["block", "flag"]
Pii = Literal["redact", "block", "flag"]
Fail = Literal["closed", "open"]


@dataclass(frozen=True)
class GuardPolicy:
    name: str
    judge: str | None = None
    injection: Injection = "block"
    pii: Pii = "redact"
    wait_ms: int = DEFAULT_WAIT_MS
    fail: Fail = "closed"

    def document(self) -> JSONObject:
        return {
            "name": self.name,
            "judge": self.judge,
            "injection": self.injection,
            "pii": self.pii,
            "wait_ms": self.wait_ms,
            "fail": self.fail,
        }

    @classmethod
    def read(cls, doc: JSONObject) -> GuardPolicy | None:
        """A policy from its document; None when it has no name. A field of the wrong
        kind takes its default (a document written by another llmgw)."""
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            return None
        judge = doc.get("judge")
        injection = doc.get("injection")
        pii = doc.get("pii")
        wait = doc.get("wait_ms")
        fail = doc.get("fail")
        return cls(
            name=name,
            judge=judge if isinstance(judge, str) and judge else None,
            injection="flag" if injection == "flag" else "block",
            pii="block" if pii == "block" else "flag" if pii == "flag" else "redact",
            wait_ms=wait if isinstance(wait, int) and 0 < wait <= MAX_WAIT_MS else DEFAULT_WAIT_MS,
            fail="open" if fail == "open" else "closed",
        )


@dataclass(frozen=True)
class PolicyAdd:
    """A guard policy, as ``ctl guard policy add`` sends it."""

    name: str = spec(doc="the policy's name", pattern=POLICY_NAME, pattern_doc=POLICY_WORDS)
    judge: str | None = spec(
        None, doc="the catalog model that judges each text (none: pattern rules only)"
    )
    injection: Injection = spec("block", doc="an instruction found: block, or flag")
    pii: Pii = spec("redact", doc="personal data found: redact, block, or flag")
    wait_ms: int = spec(
        DEFAULT_WAIT_MS, doc="how long a judgment may take (ms)", minimum=50, maximum=MAX_WAIT_MS
    )
    fail: Fail = spec("closed", doc="a judgment past its wait: closed refuses, open flags")


def read_document(raw: str | None) -> dict[str, GuardPolicy]:
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {}
    found = doc.get("policies") if isinstance(doc, dict) else None
    out: dict[str, GuardPolicy] = {}
    for item in found if isinstance(found, list) else []:
        policy = GuardPolicy.read(item) if isinstance(item, dict) else None
        if policy is not None:
            out[policy.name] = policy
    return out


class KeptPolicies:
    """The policies in memory, read from and written to the store's settings."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.now: dict[str, GuardPolicy] = {}

    async def load(self) -> None:
        self.now = read_document(await self.store.get_setting(SETTING))

    async def write(
        self, policies: dict[str, GuardPolicy], by: Principal, action: str, target: str
    ) -> None:
        """The policies written whole with their audit entry, then taken."""
        doc = {"policies": [p.document() for _, p in sorted(policies.items())]}
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        await self.store.audit(by.name, action, target, "")
        self.now = policies
