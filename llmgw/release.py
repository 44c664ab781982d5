"""llmgw's own releases: what one is, how it is fetched and checked, and how the running
zipapp is swapped for it.

A release source has GitHub's release layout (``{source}/download/v{VERSION}/{ASSET}``),
so GitHub, a plain web server, or the control plane's mirror can serve one. A release is:

- ``llmgw-{VERSION}-{PLATFORM}.pyz``, one zipapp per platform (``py311-linux-x86_64``:
  the zipapp carries compiled wheels for one CPython and one machine), with
  ``{ASSET}.sha256`` beside it;
- ``SHA256SUMS``, ``sha256sum``'s lines for every asset;
- ``SHA256SUMS.sig``, the base64 Ed25519 signature of ``SHA256SUMS``'s exact bytes by a
  key in ``llmgw.releasekey.PUBLIC_KEYS``.

``fetch`` takes the signature first, then the sums, then the asset, streamed into a file
beside where it will go and hashed as it comes; nothing is used until all three agree.
``swap_in`` keeps the old zipapp beside the new one (``llmgw-OLD.pyz``) and swaps by
rename, so a full disk or a failed download leaves the old file in place and running.

Blocking (urllib): the async callers run it in a thread.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import platform
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from functools import total_ordering
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from llmgw.releasekey import PUBLIC_KEYS

if TYPE_CHECKING:  # imported where used: most commands never sign
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DEFAULT_SOURCE = "https://github.com/llmgw/llmgw/releases"
SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.sig"
# A read that moves no byte for this long is a stalled source.
READ_TIMEOUT = 30.0
# The whole of one fetch (the zipapp is ~40 MB).
FETCH_DEADLINE = 600.0
MAX_ZIPAPP = 512 * 1024 * 1024
MAX_SMALL = 1024 * 1024
CHUNK = 1 << 16

_VERSION = re.compile(r"^v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})(?:-?(a|b|rc|dev)(\d{1,4}))?\Z")
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *]([A-Za-z0-9][A-Za-z0-9._+-]{0,200})$")
_PRE_ORDER = {"dev": 0, "a": 1, "b": 2, "rc": 3}


class ReleaseError(RuntimeError):
    """A release could not be had or did not check out; the message says which part,
    from where, and what to do. Nothing was changed."""


class ReleaseNotFound(ReleaseError):
    """The source has no such file (404): most often, no such version there."""


@total_ordering
@dataclass(frozen=True)
class Version:
    """``MAJOR.MINOR.PATCH`` with an optional ``a``/``b``/``rc``/``dev`` pre-release;
    a pre-release orders before its release."""

    major: int
    minor: int
    patch: int
    pre: str = ""
    pre_n: int = 0

    @classmethod
    def parse(cls, text: str) -> Version:
        m = _VERSION.match(text.strip())
        if m is None:
            raise ReleaseError(
                f"{text!r} is not an llmgw version: give MAJOR.MINOR.PATCH, e.g. 0.2.0 "
                "(or 0.2.0rc1)"
            )
        pre = m[4] or ""
        return cls(int(m[1]), int(m[2]), int(m[3]), pre, int(m[5] or 0))

    def _key(self) -> tuple[int, int, int, int, int]:
        rank = _PRE_ORDER[self.pre] if self.pre else 9
        return (self.major, self.minor, self.patch, rank, self.pre_n)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        base = f"{self.major}.{self.minor}.{self.patch}"
        return f"{base}{self.pre}{self.pre_n}" if self.pre else base


def platform_tag(python: tuple[int, int] | None = None, machine: str | None = None) -> str:
    """The platform a zipapp is built for: ``py311-linux-x86_64`` (this one by default)."""
    major, minor = python or sys.version_info[:2]
    return f"py{major}{minor}-linux-{machine or platform.machine()}"


def asset_name(version: str, tag: str | None = None) -> str:
    return f"llmgw-{version}-{tag or platform_tag()}.pyz"


def release_url(source: str, version: str, name: str) -> str:
    return f"{source.rstrip('/')}/download/v{version}/{name}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- checksums and their signature ----------------------------------------------------


def format_sums(digests: dict[str, str]) -> bytes:
    """``sha256sum``'s lines for ``{name: hex}``, sorted by name."""
    return "".join(f"{hex_}  {name}\n" for name, hex_ in sorted(digests.items())).encode()


def parse_sums(data: bytes, where: str = SUMS) -> dict[str, str]:
    """``{name: hex}`` from ``SHA256SUMS``; a line of any other shape is refused."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ReleaseError(f"{where} is not a checksums file (not ASCII text)") from None
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _SUM_LINE.match(line.strip())
        if m is None:
            raise ReleaseError(
                f"{where} line {number} is not `SHA256  NAME`: {line[:80]!r}; the release "
                "source does not serve an llmgw release there"
            )
        out[m[2]] = m[1]
    if not out:
        raise ReleaseError(f"{where} names no file")
    return out


def _private_key(pem: bytes) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = serialization.load_pem_private_key(pem, None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ReleaseError(
            "the signing key is not an Ed25519 key (openssl genpkey -algorithm ed25519)"
        )
    return key


def sign(data: bytes, private_key_pem: bytes) -> bytes:
    """The base64 signature (``SHA256SUMS.sig``'s content) of ``data``."""
    return base64.b64encode(_private_key(private_key_pem).sign(data)) + b"\n"


def public_key_of(private_key_pem: bytes) -> str:
    """The base64 raw public key of a PEM Ed25519 private key."""
    from cryptography.hazmat.primitives import serialization

    public = _private_key(private_key_pem).public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def verify_signature(
    data: bytes, signature: bytes, keys: tuple[str, ...] = PUBLIC_KEYS, where: str = SIGNATURE
) -> None:
    """Refuse ``data`` unless ``signature`` is a key of ``keys``'s over it."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        raw = base64.b64decode(signature.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ReleaseError(f"{where} is not a base64 signature") from None
    if len(raw) != 64:
        raise ReleaseError(f"{where} is not an Ed25519 signature ({len(raw)} bytes, not 64)")
    for key in keys:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(key))
        with contextlib.suppress(InvalidSignature):
            public.verify(raw, data)
            return
    raise ReleaseError(
        f"{where} does not match {SUMS}: the checksums were not signed by a key this llmgw "
        "trusts (a tampered or foreign release); nothing was changed"
    )


# --- fetching -------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    """A release's zipapp, checked: where it lies (beside its final place) and what."""

    version: str
    name: str
    path: Path
    sha256: str
    size: int


def _open(url: str, timeout: float) -> BinaryIO:
    request = urllib.request.Request(url, headers={"User-Agent": "llmgw"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise ReleaseNotFound(f"{url}: not found (404)") from None
        raise ReleaseError(f"{url}: the release source answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ReleaseError(f"{url}: cannot reach the release source ({reason})") from None


def _read(
    url: str, sink: list[bytes] | BinaryIO, limit: int, timeout: float, deadline: float
) -> int:
    """Copy ``url``'s body into ``sink`` (a file or a list of chunks), refusing more than
    ``limit`` bytes, a read that stalls ``timeout`` seconds, or one past ``deadline``."""
    total = 0
    with _open(url, timeout) as resp:
        while True:
            if time.monotonic() > deadline:
                raise ReleaseError(
                    f"{url}: the release source is too slow (gave up after {total} bytes)"
                )
            try:
                chunk = resp.read(CHUNK)
            except TimeoutError:
                raise ReleaseError(
                    f"{url}: the release source stalled ({timeout:.0f}s without a byte, after "
                    f"{total} bytes)"
                ) from None
            except OSError as exc:
                raise ReleaseError(f"{url}: the download broke off ({exc})") from None
            if not chunk:
                return total
            total += len(chunk)
            if total > limit:
                raise ReleaseError(f"{url}: larger than {limit} bytes; not an llmgw release file")
            if isinstance(sink, list):
                sink.append(chunk)
            else:
                sink.write(chunk)


def fetch_small(url: str, timeout: float = READ_TIMEOUT, deadline: float | None = None) -> bytes:
    chunks: list[bytes] = []
    _read(url, chunks, MAX_SMALL, timeout, deadline or time.monotonic() + FETCH_DEADLINE)
    return b"".join(chunks)


def checked_sums(
    source: str, version: str, *, keys: tuple[str, ...] = PUBLIC_KEYS, timeout: float = READ_TIMEOUT
) -> dict[str, str]:
    """A release's ``{asset: sha256}``, its signature checked first."""
    version = str(Version.parse(version))
    deadline = time.monotonic() + FETCH_DEADLINE
    try:
        signature = fetch_small(release_url(source, version, SIGNATURE), timeout, deadline)
    except ReleaseNotFound as exc:
        raise ReleaseNotFound(
            f"no llmgw release {version} at {source} ({exc}): check the version (and --source)"
        ) from None
    sums = fetch_small(release_url(source, version, SUMS), timeout, deadline)
    verify_signature(sums, signature, keys, where=f"{release_url(source, version, SIGNATURE)}")
    return parse_sums(sums, where=release_url(source, version, SUMS))


def fetch(
    source: str,
    version: str,
    into: Path,
    *,
    tag: str | None = None,
    keys: tuple[str, ...] = PUBLIC_KEYS,
    timeout: float = READ_TIMEOUT,
    expect_sha256: str | None = None,
) -> Fetched:
    """This platform's zipapp of ``version`` from ``source``, checked against the signed
    sums (and ``expect_sha256`` when the control plane sent one), written to a hidden file
    in the directory ``into``. On any failure the partial file is gone."""
    version = str(Version.parse(version))
    name = asset_name(version, tag)
    sums = checked_sums(source, version, keys=keys, timeout=timeout)
    want = sums.get(name)
    if want is None:
        raise ReleaseError(
            f"release {version} at {source} has no {name} (it has {', '.join(sorted(sums))}): "
            "no build for this platform"
        )
    if expect_sha256 and expect_sha256 != want:
        raise ReleaseError(
            f"{name}: the control plane expects sha256 {expect_sha256[:12]}…, the signed sums "
            f"say {want[:12]}…: not the release it named; nothing was changed"
        )
    into.mkdir(parents=True, exist_ok=True)
    part = into / f".{name}.part"
    url = release_url(source, version, name)
    try:
        with part.open("wb") as fh:
            size = _read(url, fh, MAX_ZIPAPP, timeout, time.monotonic() + FETCH_DEADLINE)
            fh.flush()
            os.fsync(fh.fileno())
        got = sha256_file(part)
        if got != want:
            raise ReleaseError(
                f"{url}: sha256 {got[:12]}… is not the signed {want[:12]}… (a corrupt or "
                "tampered download); nothing was changed"
            )
        if not _is_zipapp(part):
            raise ReleaseError(f"{url}: not a zipapp")
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ReleaseError(f"writing {part} failed ({exc}); nothing was changed") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return Fetched(version=version, name=name, path=part, sha256=want, size=size)


def _is_zipapp(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return "__main__.py" in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


# --- swapping ---------------------------------------------------------------------------


def running_zipapp(argv0: str | None = None) -> Path | None:
    """The zipapp this process runs from, or None (run from a source tree or a venv)."""
    arg = sys.argv[0] if argv0 is None else argv0
    path = Path(arg)
    if not arg or not path.is_file() or not _is_zipapp(path):
        return None
    return path.resolve()


def swap_in(fetched: Fetched, target: Path, old_version: str) -> Path:
    """Put ``fetched`` at ``target`` by rename, keeping the file it replaces beside it as
    ``llmgw-OLD.pyz`` (a hard link, or a copy where links cannot be made). Returns where
    the old one is kept. A failure leaves ``target`` as it was."""
    kept = target.with_name(f"llmgw-{old_version}.pyz")
    if fetched.path.parent.resolve() != target.parent.resolve():
        fetched.path.unlink(missing_ok=True)
        raise ReleaseError(f"{fetched.path} is not beside {target}: cannot swap by rename")
    keeping = False
    try:
        if target.exists():
            kept.unlink(missing_ok=True)
            keeping = True
            try:
                os.link(target, kept)
            except OSError:
                import shutil

                shutil.copy2(target, kept)
        os.chmod(fetched.path, 0o755)
        os.replace(fetched.path, target)
    except OSError as exc:
        fetched.path.unlink(missing_ok=True)
        if keeping:  # a copy the full disk cut short is no old zipapp to go back to
            kept.unlink(missing_ok=True)
        raise ReleaseError(
            f"swapping {target} failed ({exc}); the old zipapp stays and runs"
        ) from None
    return kept


# Starting a zipapp the first time unpacks it (shiv), tens of seconds on a busy machine.
START_CHECK = 180.0


def check_starts(zipapp: Path, version: str, timeout: float = START_CHECK) -> None:
    """Run ``zipapp --version`` with this Python, and refuse one that does not say
    ``llmgw {version}``. Shiv unpacks a zipapp once, at its first start: done here,
    before the process that runs it is started again on it, that restart is short."""
    try:
        proc = subprocess.run(
            [sys.executable, str(zipapp), "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"{zipapp} does not start: {exc}") from None
    if proc.returncode != 0 or proc.stdout.strip() != f"llmgw {version}":
        said = (proc.stdout + proc.stderr).strip()[-300:]
        raise ReleaseError(
            f"{zipapp} does not start as llmgw {version} (exit {proc.returncode}: {said})"
        )


def swap_in_started(fetched: Fetched, target: Path, old_version: str) -> Path:
    """``swap_in``, then ``check_starts``: a zipapp that does not start is swapped back
    out (the old one in place again) and refused."""
    kept = swap_in(fetched, target, old_version)
    try:
        check_starts(target, fetched.version)
    except ReleaseError as exc:
        try:
            os.replace(kept, target)
        except OSError as back:
            raise ReleaseError(f"{exc}; putting the old one back failed: {back}") from None
        raise ReleaseError(f"{exc}; the old zipapp is back in place") from None
    return kept
