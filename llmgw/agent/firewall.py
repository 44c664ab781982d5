"""llmgw's own nftables table, ``inet llmgw``, kept by the agent as the control plane says.

An engine listens on a TCP port of the node with no login of its own: whoever reaches
the port can use the model. The table lets only the control planes (and the replica's
own other nodes, for a model split over several) reach the engine port range, and, on
a machine that runs a control plane, lets only the cluster's networks reach the port
agents connect to. Everything else aimed at those ports is answered with a TCP reset,
so a client outside sees "connection refused" at once rather than a timeout.

The table is llmgw's alone: one chain hooked on input with policy accept, so what it
does not name passes on to the machine's own rules (which it never reads nor touches).
It is replaced whole in one ``nft -f`` transaction, so no moment exists without rules.
The last plan the control plane sent is kept in ``STATE_DIR/firewall.json`` so that
``llmgw firewall sync`` (and an agent starting again) can load it without the cluster.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from llmgw.jsonvalue import JSON, as_list, as_object, as_str

TABLE = "llmgw"
STATE_FILE = "firewall.json"
HOOK = "type filter hook input priority filter - 5; policy accept;"
REJECT = "reject with tcp reset"

Net = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# (type, hook, priority, policy) of the one chain, as `nft -j` says them.
_CHAIN = ("filter", "input", -5, "accept")


class PlanMap(TypedDict):
    """A plan's JSON form: what the control plane sends and ``firewall.json`` holds."""

    enabled: bool
    networks: list[str]
    control_planes: list[str]
    engine_ports: str
    agent_port: int | None
    peers: dict[str, list[str]]  # engine port (as JSON's key, a string) -> addresses
    # "LO-HI" -> addresses: where NCCL's and gloo's ports may fall (``ephemeral``).
    peer_ranges: NotRequired[dict[str, list[str]]]
    # The agent's own metrics port (agent.metrics_listen) and who may scrape it.
    metrics_port: NotRequired[int | None]
    metrics_scrapers: NotRequired[list[str]]


class FirewallStatus(TypedDict):
    """``Nft.status``'s answer (``llmgw firewall status --json`` adds the plan)."""

    present: bool
    in_sync: bool | None
    rules: list[str]
    problem: str | None
    nft: bool
    plan: NotRequired[PlanMap | None]


class FirewallError(RuntimeError):
    """A plan that does not hold, or nft refusing what it was given (its words kept)."""


def _nets(field_name: str, values: Iterable[str], *, hosts: bool = False) -> tuple[Net, ...]:
    """Each value as a network (an address is its /32 or /128); the bad one named. With
    ``hosts``, host bits under the prefix (10.0.0.5/24) are refused: a slip, most likely,
    and quietly allowing the whole /24 would be worse."""
    out = []
    for value in values:
        if not isinstance(value, str):
            raise FirewallError(f"{field_name}: {value!r} is not an address or CIDR")
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=hosts))
        except ValueError as exc:
            raise FirewallError(
                f"{field_name}: {value!r} is not an address or CIDR ({exc})"
            ) from None
    return tuple(out)


def _canonical(nets: Iterable[Net], version: int) -> tuple[Net, ...]:
    """The fewest CIDRs covering ``nets`` of one IP version, sorted: the same for two
    lists allowing the same addresses, however written. nft refuses overlapping
    elements in an interval set, so what is loaded is always this form."""
    same = [n for n in nets if n.version == version]
    return tuple(ipaddress.collapse_addresses(same))  # type: ignore[type-var]


def _port_range(text: str) -> tuple[int, int]:
    lo, sep, hi = str(text).strip().partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        raise FirewallError(f"engine_ports: {text!r} is not a port range LO-HI") from None
    if not 1 <= first <= last <= 65535:
        raise FirewallError(f"engine_ports: {text!r} is not a port range LO-HI within 1-65535")
    return first, last


@dataclass(frozen=True)
class FirewallPlan:
    """What the control plane wants this node's table to do. Checked when made."""

    enabled: bool = True
    networks: tuple[str, ...] = ()
    control_planes: tuple[str, ...] = ()
    engine_ports: str = "41000-41999"
    agent_port: int | None = None
    peers: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    # Ranges of the engine ports a replica's member nodes are let in to, beside its own
    # ports: where NCCL and gloo listen on ports the kernel picks (``ephemeral``).
    peer_ranges: Mapping[tuple[int, int], tuple[str, ...]] = field(default_factory=dict)
    # The agent's own metrics port, let in only from ``metrics_scrapers`` when any are
    # named (agent.yaml's, not the cluster's word: the agent knows where it listens).
    metrics_port: int | None = None
    metrics_scrapers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _nets("networks", self.networks, hosts=True)
        _nets("control_planes", self.control_planes)
        first, last = _port_range(self.engine_ports)
        if self.agent_port is not None:
            if not 1 <= self.agent_port <= 65535:
                raise FirewallError(f"agent_port: {self.agent_port} is not a TCP port")
            if first <= self.agent_port <= last:
                raise FirewallError(
                    f"agent_port: {self.agent_port} lies in engine_ports {self.engine_ports}"
                )
        if self.metrics_port is not None:
            if not 1 <= self.metrics_port <= 65535:
                raise FirewallError(f"metrics_port: {self.metrics_port} is not a TCP port")
            if first <= self.metrics_port <= last:
                raise FirewallError(
                    f"metrics_port: {self.metrics_port} lies in engine_ports "
                    f"{self.engine_ports}; give agent.metrics_listen another port"
                )
        _nets("metrics_scrapers", self.metrics_scrapers)
        for port, addresses in self.peers.items():
            if not first <= port <= last:
                raise FirewallError(
                    f"peers: port {port} is outside engine_ports {self.engine_ports}"
                )
            _nets(f"peers[{port}]", addresses)
        for (lo, hi), addresses in self.peer_ranges.items():
            if not first <= lo <= hi <= last:
                raise FirewallError(
                    f"peer_ranges: {lo}-{hi} is not a range within engine_ports {self.engine_ports}"
                )
            _nets(f"peer_ranges[{lo}-{hi}]", addresses)

    @classmethod
    def from_map(cls, data: Mapping[str, object]) -> FirewallPlan:
        """A plan from its JSON form. Keys this agent does not know are left out, so a
        newer control plane's plan still applies what an older agent understands."""

        def strings(name: str, value: object) -> tuple[str, ...]:
            if isinstance(value, str) or not isinstance(value, list | tuple):
                raise FirewallError(f"{name}: expected a list of addresses, got {value!r}")
            return tuple(value)

        def port(name: str, value: object) -> int:
            if isinstance(value, bool) or not str(value).isdigit():
                raise FirewallError(f"{name}: {value!r} is not a TCP port")
            return int(str(value))

        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise FirewallError(f"enabled: expected true or false, got {enabled!r}")
        agent_port = data.get("agent_port")
        metrics_port = data.get("metrics_port")
        peers = data.get("peers") or {}
        if not isinstance(peers, Mapping):
            raise FirewallError(f"peers: expected a map of port to addresses, got {peers!r}")
        ranges = data.get("peer_ranges") or {}
        if not isinstance(ranges, Mapping):
            raise FirewallError(
                f"peer_ranges: expected a map of LO-HI to addresses, got {ranges!r}"
            )
        return cls(
            enabled=enabled,
            networks=strings("networks", data.get("networks") or []),
            control_planes=strings("control_planes", data.get("control_planes") or []),
            engine_ports=str(data.get("engine_ports") or "41000-41999"),
            agent_port=None if agent_port is None else port("agent_port", agent_port),
            peers={port("peers", p): strings(f"peers[{p}]", a) for p, a in peers.items()},
            peer_ranges={
                _port_range(str(r)): strings(f"peer_ranges[{r}]", a) for r, a in ranges.items()
            },
            metrics_port=None if metrics_port is None else port("metrics_port", metrics_port),
            metrics_scrapers=strings("metrics_scrapers", data.get("metrics_scrapers") or []),
        )

    def to_map(self) -> PlanMap:
        return {
            "enabled": self.enabled,
            "networks": list(self.networks),
            "control_planes": list(self.control_planes),
            "engine_ports": self.engine_ports,
            "agent_port": self.agent_port,
            "peers": {str(p): list(a) for p, a in sorted(self.peers.items())},
            "peer_ranges": {
                f"{lo}-{hi}": list(a) for (lo, hi), a in sorted(self.peer_ranges.items())
            },
            "metrics_port": self.metrics_port,
            "metrics_scrapers": list(self.metrics_scrapers),
        }


@dataclass(frozen=True)
class _Rule:
    """One rule, in a form both render() writes and a loaded table's JSON reads back to.
    ``other`` holds any rule llmgw does not write (someone's edit), so it never matches."""

    verdict: str
    head: str | None = None  # iif "lo" / ct state established,related
    ports: tuple[int, int] | None = None
    family: str | None = None  # "ip" / "ip6"
    source: str | tuple[Net, ...] | None = None  # "@cp4", or an anonymous set
    other: str | None = None

    def text(self) -> str:
        words = [self.head] if self.head else []
        if self.ports:
            lo, hi = self.ports
            words.append(f"tcp dport {lo}" if lo == hi else f"tcp dport {lo}-{hi}")
        if isinstance(self.source, str):
            words.append(f"{self.family} saddr {self.source}")
        elif self.source is not None:
            words.append(f"{self.family} saddr {{ {_elements(self.source)} }}")
        return " ".join([*words, self.verdict])


@dataclass(frozen=True)
class _Table:
    sets: tuple[tuple[str, tuple[str, tuple[Net, ...]]], ...]  # (name, (type, elements))
    chains: tuple[tuple[str, tuple[JSON, ...]], ...]  # (name, (type, hook, prio, policy))
    rules: tuple[_Rule, ...]


def _elements(nets: Iterable[Net]) -> str:
    return ", ".join(
        str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n) for n in nets
    )


def _model(plan: FirewallPlan) -> _Table:
    """The table ``plan`` asks for. Named sets are defined even when empty (nft refuses
    an empty anonymous set); a peer rule is written only for a port with peers."""
    cps, nets = _nets("control_planes", plan.control_planes), _nets("networks", plan.networks)
    sets = tuple(
        (f"{name}{v}", (f"ipv{v}_addr", _canonical(found, v)))
        for name, found in (("cp", cps), ("nets", nets))
        for v in (4, 6)
    )
    engines = _port_range(plan.engine_ports)
    rules = [_Rule("accept", head='iif "lo"'), _Rule("accept", head="ct state established,related")]
    ranges = [((p, p), a) for p, a in plan.peers.items()] + list(plan.peer_ranges.items())
    for ports, addresses in sorted(ranges):
        peers = _nets(f"peers[{ports[0]}]", addresses)
        for family, version in (("ip", 4), ("ip6", 6)):
            if same := _canonical(peers, version):
                rules.append(_Rule("accept", ports=ports, family=family, source=same))
    scrapers = _nets("metrics_scrapers", plan.metrics_scrapers)
    if plan.metrics_port is not None and scrapers:
        # The agent's metrics port: only the named scrapers; others are reset.
        ports = (plan.metrics_port, plan.metrics_port)
        for family, version in (("ip", 4), ("ip6", 6)):
            if same := _canonical(scrapers, version):
                rules.append(_Rule("accept", ports=ports, family=family, source=same))
        rules.append(_Rule(REJECT, ports=ports))
    guarded = [(engines, "cp")]
    if plan.agent_port is not None and plan.networks:
        guarded.append(((plan.agent_port, plan.agent_port), "nets"))
    for ports, name in guarded:
        rules.append(_Rule("accept", ports=ports, family="ip", source=f"@{name}4"))
        rules.append(_Rule("accept", ports=ports, family="ip6", source=f"@{name}6"))
        rules.append(_Rule(REJECT, ports=ports))
    return _Table(sets, (("input", _CHAIN),), tuple(rules))


def render(plan: FirewallPlan) -> str:
    """The nft script replacing table inet llmgw in one transaction: made if absent,
    deleted, defined again. nft applies a script whole or not at all."""
    table = _model(plan)
    lines = [f"table inet {TABLE} {{}}", f"delete table inet {TABLE}", f"table inet {TABLE} {{"]
    for name, (kind, elements) in table.sets:
        said = f" elements = {{ {_elements(elements)} }};" if elements else ""
        lines.append(f"  set {name} {{ type {kind}; flags interval;{said} }}")
    lines += ["  chain input {", f"    {HOOK}"]
    lines += [f"    {rule.text()}" for rule in table.rules]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


# --- reading a loaded table back ------------------------------------------------------


def _port(value: JSON) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected a port, got {json.dumps(value)}")
    return value


def _interval(value: JSON) -> tuple[Address, Address]:
    """An element of `nft -j` (address, prefix or range) as its first and last address."""
    if isinstance(value, str):
        address = ipaddress.ip_address(value)
        return address, address
    if isinstance(value, dict) and "prefix" in value:
        prefix = as_object(value["prefix"])
        net = ipaddress.ip_network(f"{prefix['addr']}/{prefix['len']}")
        return net.network_address, net.broadcast_address
    if isinstance(value, dict) and "range" in value:
        first, last = as_list(value["range"])
        return ipaddress.ip_address(as_str(first)), ipaddress.ip_address(as_str(last))
    if isinstance(value, dict) and "elem" in value:
        return _interval(as_object(value["elem"])["val"])
    raise ValueError(f"element {json.dumps(value)}")


def _nets_of(values: JSON) -> tuple[Net, ...]:
    if isinstance(values, dict) and "set" in values:
        values = values["set"]
    if not isinstance(values, list):
        values = [values]
    found: list[Net] = []
    for value in values:
        first, last = _interval(value)
        found.extend(ipaddress.summarize_address_range(first, last))
    return _canonical(found, 4) + _canonical(found, 6)


class _RuleParts(TypedDict, total=False):
    verdict: str
    head: str
    ports: tuple[int, int]
    family: str
    source: str | tuple[Net, ...]


def _rule_of(exprs: JSON) -> _Rule:
    """A loaded rule back in _Rule's form; whatever llmgw does not write (another
    match, a counter, a second port) lands in ``other`` whole."""
    got: _RuleParts = {}

    def put(part: _RuleParts) -> None:
        if part.keys() & got.keys():
            raise ValueError(f"a second {', '.join(part)}")
        got.update(part)

    try:
        for expr in as_list(exprs):
            expr = as_object(expr)
            if "accept" in expr:
                put({"verdict": "accept"})
                continue
            if expr.get("reject") == {"type": "tcp reset"}:
                put({"verdict": REJECT})
                continue
            match = as_object(expr["match"]) if "match" in expr else None
            if match is None or match.get("op") not in ("==", "in"):
                raise ValueError
            left, right = as_object(match["left"]), match["right"]
            if left == {"meta": {"key": "iif"}} and right == "lo":
                put({"head": 'iif "lo"'})
            elif left == {"ct": {"key": "state"}}:
                states = right if isinstance(right, list) else [right]
                put({"head": "ct state " + ",".join(sorted(as_str(s) for s in states))})
            elif left == {"payload": {"protocol": "tcp", "field": "dport"}}:
                if isinstance(right, dict):
                    lo, hi = as_list(right["range"])
                    put({"ports": (_port(lo), _port(hi))})
                else:
                    put({"ports": (_port(right), _port(right))})
            elif as_object(left.get("payload", {})).get("field") == "saddr":
                put({"family": as_str(as_object(left["payload"])["protocol"])})
                if isinstance(right, str) and right.startswith("@"):
                    put({"source": right})
                else:
                    put({"source": _nets_of(right)})
            else:
                raise ValueError
        return _Rule(**got)
    except (ValueError, KeyError, TypeError, AttributeError):
        return _Rule("?", other=json.dumps(exprs, sort_keys=True))


def _loaded(listing: JSON) -> _Table:
    """The table in ``nft -j list table inet llmgw``'s answer, in _model's form."""
    sets: list[tuple[str, tuple[str, tuple[Net, ...]]]] = []
    chains: list[tuple[str, tuple[JSON, ...]]] = []
    rules: list[_Rule] = []
    for item in as_list(as_object(listing).get("nftables", [])):
        item = as_object(item)
        if "set" in item:
            s = as_object(item["set"])
            sets.append((as_str(s["name"]), (as_str(s["type"]), _nets_of(s.get("elem", [])))))
        elif "chain" in item:
            c = as_object(item["chain"])
            chains.append(
                (as_str(c["name"]), tuple(c.get(k) for k in ("type", "hook", "prio", "policy")))
            )
        elif "rule" in item:
            rules.append(_rule_of(as_object(item["rule"]).get("expr", [])))
    return _Table(tuple(sets), tuple(chains), tuple(rules))


def difference(plan: FirewallPlan, listing: JSON) -> str | None:
    """What the loaded table (``nft -j``'s answer) does that ``plan`` does not; None when
    the two agree.

    Compared by meaning, not by text: each set as the addresses it holds (an element
    listed as an address, a prefix or a range counts the same), the chain's hook,
    priority and policy, and every rule in order as its port, source and verdict. So
    the way one nft version prints a table does not make it differ, while any rule
    added, removed or changed by hand does.
    """
    want, have = _model(plan), _loaded(listing)
    if have.chains != want.chains:
        return f"chains {[c[0] for c in have.chains]} are not the plan's one input chain"
    wanted, found = dict(want.sets), dict(have.sets)
    for name in sorted(wanted.keys() | found.keys()):
        if name not in wanted or name not in found or wanted[name] != found[name]:
            held = f"{{ {_elements(found[name][1])} }}" if name in found else "absent"
            said = f"{{ {_elements(wanted[name][1])} }}" if name in wanted else "no such set"
            return f"set {name} is {held}; the plan says {said}"
    if have.rules != want.rules:
        extra = [r.other or r.text() for r in have.rules if r not in want.rules]
        missing = [r.text() for r in want.rules if r not in have.rules]
        parts = [f"not in the plan: {'; '.join(extra)}"] if extra else []
        parts += [f"missing: {'; '.join(missing)}"] if missing else []
        return "rules differ from the plan: " + (" / ".join(parts) or "in another order")
    return None


# --- the plan kept in the state dir ---------------------------------------------------


def save_plan(state_dir: Path, plan: FirewallPlan) -> None:
    """Written whole or not at all (a file beside it, renamed over)."""
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.to_map(), indent=2) + "\n")
    os.replace(tmp, path)


def load_plan(state_dir: Path) -> FirewallPlan | None:
    """The last plan saved, None when the control plane never sent one."""
    path = state_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FirewallError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise FirewallError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        return FirewallPlan.from_map(data)
    except FirewallError as exc:
        raise FirewallError(f"{path}: {exc}") from exc


# --- nft ------------------------------------------------------------------------------

_ABSENT = "No such file or directory"
_NOT_ROOT = "Operation not permitted"
ROOT_NOTE = "the agent keeps llmgw's table only when it runs as root"


def available() -> bool:
    """nft is installed and we are root: without both no table is kept."""
    return shutil.which("nft") is not None and os.geteuid() == 0


class Nft:
    """nft, run as ``argv`` (a prefix: tests run it inside a network namespace)."""

    def __init__(self, argv: Sequence[str] = ("nft",)) -> None:
        self.argv = tuple(argv)

    def _run(self, *args: str, script: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*self.argv, *args],
                input=script,
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "LC_ALL": "C"},
                check=False,
            )
        except FileNotFoundError:
            raise FirewallError(f"{self.argv[0]} is not installed (Debian: nftables)") from None
        except subprocess.TimeoutExpired as exc:
            raise FirewallError(f"{' '.join(self.argv)} gave no answer in 30 s") from exc

    def apply(self, plan: FirewallPlan) -> None:
        """Load ``plan``'s table (replacing the old one at once), or remove the table
        when the plan says the firewall is off."""
        if not plan.enabled:
            self.remove()
            return
        done = self._run("-f", "-", script=render(plan))
        if done.returncode != 0:
            words = done.stderr.strip() or f"exit status {done.returncode}"
            hint = f" ({ROOT_NOTE})" if _NOT_ROOT in words else ""
            raise FirewallError(f"nft refused llmgw's table{hint}: {words}")

    def remove(self) -> bool:
        """Delete table inet llmgw; False when it was not there."""
        done = self._run("delete", "table", "inet", TABLE)
        if done.returncode == 0:
            return True
        if _ABSENT in done.stderr:
            return False
        hint = f" ({ROOT_NOTE})" if _NOT_ROOT in done.stderr else ""
        raise FirewallError(f"nft could not delete table inet {TABLE}{hint}: {done.stderr.strip()}")

    def status(self, plan: FirewallPlan | None) -> FirewallStatus:
        """What is loaded and whether it is what ``plan`` asks for (see ``difference``).

        ``in_sync`` is None when there is no plan to compare with or nft cannot tell;
        ``problem`` says what is wrong in words, None when nothing is.
        """
        out = FirewallStatus(present=False, in_sync=None, rules=[], problem=None, nft=True)
        try:
            done = self._run("-j", "list", "table", "inet", TABLE)
        except FirewallError as exc:
            out["nft"], out["problem"] = False, str(exc)
            return out
        wanted = plan is not None and plan.enabled
        if done.returncode != 0:
            words = done.stderr.strip()
            if _ABSENT in words:
                out["in_sync"] = None if plan is None else not wanted
                if wanted:
                    out["problem"] = "the table is absent; the plan wants it loaded"
            elif _NOT_ROOT in words:
                out["problem"] = f"nft may not read the ruleset: {ROOT_NOTE}"
            else:
                out["problem"] = f"nft could not list the table: {words}"
            return out
        out["present"] = True
        text = self._run("list", "table", "inet", TABLE).stdout
        out["rules"] = [
            line.replace("\t", "  ").rstrip() for line in text.splitlines() if line.strip()
        ]
        if plan is None:
            return out
        if not plan.enabled:
            out["in_sync"] = False
            out["problem"] = "the table is loaded; the plan says it is off"
            return out
        try:
            problem = difference(plan, json.loads(done.stdout))
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"nft's listing could not be read ({exc})"
        out["in_sync"], out["problem"] = problem is None, problem
        return out
