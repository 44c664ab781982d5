"""Clients chatting through a control plane while the tests do harm to it: four
official openai SDK clients without pause, each failure kept, and the control plane's
/metrics as text."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass

import openai

from tests.e2e.cluster import Cluster, wait_for

CHAT = [{"role": "user", "content": "hello"}]


class Load:
    """Four clients chatting without pause, every failure kept."""

    def __init__(self, cluster: Cluster, key: str) -> None:
        self.sdk = openai.OpenAI(
            base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0, timeout=30
        )
        self.done = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.workers = [threading.Thread(target=self.run) for _ in range(4)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
                self.done += 1
            except Exception as exc:  # every failure is counted, none hidden
                self.errors.append(exc)

    def __enter__(self) -> Load:
        for w in self.workers:
            w.start()
        wait_for(lambda: self.done >= 20, 30, "requests to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(30)
        self.sdk.close()

    def flowing_for(self, seconds: float) -> None:
        """Keep the load on for ``seconds``, checking it never stalls."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            before = self.done
            time.sleep(min(5.0, max(0.1, end - time.monotonic())))
            assert self.done > before, "requests stopped flowing"
            assert self.errors == [], self.errors[:3]


@dataclass
class Outcome:
    started: float  # monotonic
    error: BaseException | None


class KeptLoad:
    """Four clients chatting without pause; every request's start and outcome kept."""

    def __init__(self, cluster: Cluster, key: str) -> None:
        self.sdk = openai.OpenAI(
            base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0, timeout=30
        )
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.workers = [threading.Thread(target=self.run) for _ in range(4)]

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
                self.outcomes.append(Outcome(started, None))
            except Exception as exc:  # every failure is kept, none hidden
                self.outcomes.append(Outcome(started, exc))
                if isinstance(exc, openai.APIConnectionError):
                    time.sleep(0.02)  # refused at once: do not spin while it is down

    def served(self, since: float = 0.0) -> int:
        return sum(1 for o in self.outcomes if o.error is None and o.started >= since)

    def __enter__(self) -> KeptLoad:
        for w in self.workers:
            w.start()
        wait_for(lambda: self.served() >= 20, 30, "requests to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(30)
        self.sdk.close()

    def check(self, listening: float) -> None:
        """No answer but 200 (no 503, no 502), and no failure of a request sent once the
        control plane was listening again; before that, only the connection refused or
        closed."""
        answered = [o.error for o in self.outcomes if isinstance(o.error, openai.APIStatusError)]
        assert answered == [], answered[:3]
        late = [o.error for o in self.outcomes if o.error is not None and o.started >= listening]
        assert late == [], late[:3]
        other = [
            o.error
            for o in self.outcomes
            if o.error is not None and not isinstance(o.error, openai.APIConnectionError)
        ]
        assert other == [], other[:3]

    def flowing_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            before = self.served()
            time.sleep(min(5.0, max(0.1, end - time.monotonic())))
            assert self.served() > before, "requests stopped flowing"


def metrics_text(cluster: Cluster) -> str:
    req = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def vouched_lines(metrics: str) -> str:
    lines = metrics.splitlines()
    return "\n".join(line for line in lines if line.startswith("llmgw_replica_vouched"))
