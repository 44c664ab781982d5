"""The agent's answer to the control plane's ``upgrade`` request (``agent/upgrade.py``):
refused with nothing changed when it does not run from a zipapp or the release does not
check out (the control plane's sha256 too), and otherwise swapped in, answered ok, and
only then started again."""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import __version__, release, releasekey
from llmgw.agent import upgrade
from llmgw.wire.messages import Message, Request, Response
from tests.support.releases import ReleaseServer, publish, signing_key

V2 = "9.1.0"
TAG = release.platform_tag()


def zipapp(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", f"print('llmgw {version}')\n")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pem, public = signing_key()
    monkeypatch.setattr(releasekey, "PUBLIC_KEYS", (public,))
    publish(tmp_path / "releases", V2, {TAG: zipapp(tmp_path / "built" / "v2.pyz", V2)}, pem)
    with ReleaseServer(tmp_path / "releases").running() as server:
        yield server.url


async def asked(args: dict[str, object]) -> tuple[list[Message], list[str]]:
    said: list[Message] = []
    events: list[str] = []

    def emit(msg: Message) -> None:
        said.append(msg)
        events.append("answered")

    await upgrade.answer(
        Request(id="u1", kind="upgrade", args=args), emit, lambda: events.append("restarted")
    )
    return said, events


async def test_swapped_in_answered_then_started_again(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = zipapp(tmp_path / "bin" / "llmgw.pyz", __version__)
    v1 = digest(running)
    monkeypatch.setattr(release, "running_zipapp", lambda argv0=None: running)
    said, events = await asked(
        {"version": V2, "source": source, "sha256": "0" * 64, "asset": "llmgw-9.1.0-other.pyz"}
    )
    assert said == [Response(id="u1", result={"version": V2, "restarting": True})]
    assert events == ["answered", "restarted"]
    assert digest(running) == digest(tmp_path / "built" / "v2.pyz")
    assert digest(running.with_name(f"llmgw-{__version__}.pyz")) == v1


async def test_refusals_change_nothing(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = zipapp(tmp_path / "bin" / "llmgw.pyz", __version__)
    before = digest(running)
    monkeypatch.setattr(release, "running_zipapp", lambda argv0=None: running)
    # The control plane names another sha256 for this platform's asset.
    said, events = await asked(
        {"version": V2, "source": source, "sha256": "0" * 64, "asset": release.asset_name(V2)}
    )
    assert isinstance(said[0], Response) and not said[0].ok
    assert "not the release it named" in str(said[0].error)
    said, _ = await asked({"version": "9.9.9", "source": source})
    assert isinstance(said[0], Response) and "404" in str(said[0].error)
    said, _ = await asked({"version": V2})
    assert isinstance(said[0], Response) and "names a version and a release source" in str(
        said[0].error
    )
    monkeypatch.setattr(release, "running_zipapp", lambda argv0=None: None)
    said, events = await asked({"version": V2, "source": source})
    assert isinstance(said[0], Response) and "does not run from a zipapp" in str(said[0].error)
    assert "restarted" not in events
    assert digest(running) == before
    assert sorted(p.name for p in running.parent.iterdir()) == ["llmgw.pyz"]
