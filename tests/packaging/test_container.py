"""packaging/container/Containerfile, built step by step in a scratch root.

A real `podman build` cannot run here: its base image (debian:12-slim) comes from a
registry this machine cannot reach. So the test plays the build itself: the Containerfile
is parsed, and its steps are carried out in an overlay of this Debian 12 machine (a
mount namespace of its own, the machine untouched): RUN lines run as written under
chroot, except the apt-get line, whose packages must already be there; COPY copies from a
build context holding what `make zipapp` made; USER, ENV and WORKDIR apply to what
follows. Then the image's ENTRYPOINT answers `--version` as its user, and its
HEALTHCHECK passes against a control plane started in the image (a network namespace of
its own, so port 8080 is its alone). Needs root (mount and network namespaces).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "packaging/container/Containerfile"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the scratch root needs root and unshare (mount and network namespaces)",
)


@dataclass
class Stage:
    base: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (with defaults) and the stages, each with its (INSTRUCTION, rest)."""
    text = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert word == "ARG", f"{word} before the first FROM"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].steps.append((word, rest))
    return args, stages


def steps_for(build_args: dict[str, str]) -> list[tuple[str, str]]:
    """The steps the last stage takes, its base stages' first, with ARGs filled in."""
    defaults, stages = parse(CONTAINERFILE.read_text())
    args = {**defaults, **build_args}
    by_name = {s.name: s for s in stages if s.name}

    def chain(stage: Stage) -> list[tuple[str, str]]:
        base = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], stage.base)
        first = chain(by_name[base]) if base in by_name else []
        if not first:
            assert base == "docker.io/library/debian:12-slim", base
        return first + stage.steps

    return chain(stages[-1])


APT = re.compile(r"apt-get (update|install .*)|rm -rf /var/lib/apt/lists/\*")


def apt_packages(command: str) -> list[str] | None:
    """The packages an apt-get RUN line installs, or None for any other line."""
    parts = [p.strip() for p in command.split("&&")]
    if not all(APT.fullmatch(p) for p in parts):
        return None
    install = next(p for p in parts if p.startswith("apt-get install"))
    return [w for w in install.split()[2:] if not w.startswith("-")]


def script(build_args: dict[str, str], context: Path, root: Path, after: str) -> str:
    """A shell script that builds the image in an overlay at ``root`` and then runs
    ``after`` (with $ROOT, $USERSPEC, $ENV and $WORKDIR set)."""
    upper, work, merged = root / "upper", root / "work", root / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    out = [
        "set -eu",
        f"ROOT={merged}",
        f"mount -t overlay overlay -o lowerdir=/,upperdir={upper},workdir={work} $ROOT",
        "mount --bind /dev $ROOT/dev && mount -t proc proc $ROOT/proc",
        "ip link set lo up",
    ]
    env = {"PATH": IMAGE_PATH, "HOME": "/root"}
    user, workdir = "0:0", "/"
    for word, rest in steps_for(build_args):
        if word == "ARG":
            key, _, default = rest.partition("=")
            env[key] = build_args.get(key, default)
        elif word == "ENV":
            key, _, value = rest.partition("=")
            env[key] = value
        elif word == "RUN":
            packages = apt_packages(rest)
            if packages is not None:
                for p in packages:  # this machine stands in for the base image and apt
                    out.append(
                        f"chroot $ROOT dpkg-query -W -f='${{Status}}' {p} | grep -q 'ok installed'"
                    )
                continue
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            run = f"cd {workdir} && {rest}"
            out.append(f"chroot --userspec={user} $ROOT env -i {exports} sh -c {shlex.quote(run)}")
        elif word == "COPY":
            src, dest = rest.split()
            assert (context / src).is_file(), f"COPY {src}: not in the build context"
            out.append(f"mkdir -p $ROOT{Path(dest).parent} && cp {context / src} $ROOT{dest}")
        elif word == "USER":
            user = rest
        elif word == "WORKDIR":
            workdir = rest
        elif word in ("EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"):
            pass
        else:
            raise AssertionError(f"{word}: a step this test does not know how to play")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    out += [f"USERSPEC={user}", f"ENV={shlex.quote(exports)}", f"WORKDIR={workdir}", after]
    return "\n".join(out) + "\n"


def instruction(word: str) -> str:
    _, stages = parse(CONTAINERFILE.read_text())
    (rest,) = [r for s in stages for w, r in s.steps if w == word]
    return rest


def in_image(command: list[str]) -> str:
    """A shell line running ``command`` in the built image as its user, in its WORKDIR;
    the command takes the shell's pid (exec), so killing that pid stops it."""
    words = " ".join(shlex.quote(c) for c in command)
    return (
        "chroot --userspec=$USERSPEC $ROOT env -i $ENV "
        f'sh -c \'cd "$0" && exec "$@"\' $WORKDIR {words}'
    )


def build(
    tmp_path: Path, build_args: dict[str, str], context: Path, after: str
) -> subprocess.CompletedProcess[str]:
    sh = tmp_path / "build.sh"
    sh.write_text(script(build_args, context, tmp_path / "root", after))
    return subprocess.run(
        ["unshare", "--mount", "--net", "--fork", "--kill-child", "sh", str(sh)],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def context(zipapp: Path, tmp_path: Path) -> Path:
    """The build context after `make zipapp`: dist/llmgw.pyz (its default ZIPAPP)."""
    assert "ZIPAPP ?= dist/llmgw.pyz" in (REPO / "Makefile").read_text()
    ctx = tmp_path / "context"
    (ctx / "dist").mkdir(parents=True)
    shutil.copy(zipapp, ctx / "dist" / "llmgw.pyz")
    return ctx


def test_the_image_runs_llmgw_as_its_own_user_and_its_healthcheck_passes(
    context: Path, tmp_path: Path
) -> None:
    entrypoint = json.loads(instruction("ENTRYPOINT"))
    assert entrypoint == ["llmgw"]
    assert instruction("EXPOSE").split() == ["8080", "8443", "8444"]
    health = instruction("HEALTHCHECK")
    assert "/healthz" in health
    check = json.loads(health[health.index("CMD") + 3 :])
    after = "\n".join(
        [
            "echo '== the image'",
            in_image(["id", "-un"]),
            in_image([*entrypoint, "--version"]),
            # A control plane in the image, then its HEALTHCHECK, until it passes.
            in_image([*entrypoint, "server", "init", "--yes", "--data-dir", "data"]),
            in_image([*entrypoint, "server", "run", "--data-dir", "data"]) + " &",
            "SERVER=$!",
            "trap 'kill $SERVER 2>/dev/null || true' EXIT",
            "for i in $(seq 120); do",
            f"  if {in_image(check)}; then echo HEALTHY; break; fi; sleep 0.5",
            "done",
            "kill $SERVER && wait $SERVER || true",
        ]
    )
    proc = build(tmp_path, {}, context, after)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    lines = lines[lines.index("== the image") + 1 :]
    assert lines[0] == "llmgw"  # USER: not root
    assert lines[1].startswith("llmgw ")  # the ENTRYPOINT, from the zipapp
    assert "HEALTHY" in lines, proc.stdout + proc.stderr
    upper = tmp_path / "root" / "upper"
    assert "llmgw:x:10001:10001:" in (upper / "etc/passwd").read_text()
    assert (upper / "opt/llmgw/llmgw.pyz").read_bytes() == (context / "dist/llmgw.pyz").read_bytes()
    # Unpacked at build time: a container starts without writing its root.
    assert any((upper / "opt/llmgw/site").iterdir())


@pytest.mark.parametrize("right", [True, False], ids=["sha256-matches", "sha256-differs"])
def test_a_release_url_is_kept_only_when_its_sha256_matches(
    context: Path, tmp_path: Path, right: bool
) -> None:
    pyz = context / "dist/llmgw.pyz"
    digest = hashlib.sha256(pyz.read_bytes()).hexdigest() if right else "0" * 64
    # file:// stands in for the release's https:// (urllib opens both); nothing local
    # is copied in this variant of the build.
    args = {"LLMGW_FROM": "release", "LLMGW_URL": pyz.as_uri(), "LLMGW_SHA256": digest}
    proc = build(tmp_path, args, context, in_image(["llmgw", "--version"]))
    kept = tmp_path / "root/upper/opt/llmgw/llmgw.pyz"
    if right:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines()[-1].startswith("llmgw ")
        assert kept.read_bytes() == pyz.read_bytes()
    else:
        assert proc.returncode != 0
        assert "FAILED" in proc.stdout + proc.stderr  # sha256sum --check's word
        assert not kept.exists()
