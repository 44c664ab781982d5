"""The roles stay apart: server, agent and tui never import each other.

They meet only in ``llmgw/wire`` and in the admin API's JSON, so a node runs the agent
without the control plane's web stack or the console's UI toolkit.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "llmgw"
ROLES = ("server", "agent", "tui")
HEAVY = ("textual", "starlette", "jinja2")


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every absolute module name ``source`` imports, anywhere in it (functions too)."""
    # A relative import is resolved against the package the module lives in.
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # `from llmgw import server` imports the role package by its attribute name.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def role_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "llmgw" and parts[1] in ROLES:
        return parts[1]
    return None


def crossings(root: Path) -> list[str]:
    """``file: imports module`` for each import from one role package into another."""
    found: list[str] = []
    for role in ROLES:
        for path in sorted((root / role).rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            is_package = rel.name == "__init__"
            parts = rel.parts[:-1] if is_package else rel.parts
            module = ".".join(parts)
            for name in sorted(imported_modules(path.read_text(), module, is_package)):
                other = role_of(name)
                if other is not None and other != role:
                    found.append(f"{path.relative_to(root.parent)}: imports {name}")
    return found


def test_role_packages_do_not_import_each_other() -> None:
    assert crossings(PACKAGE) == []


def test_the_crossing_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    # Guards the guard: each spelling of a forbidden import is caught.
    root = tmp_path / "llmgw"
    for role in ROLES:
        (root / role).mkdir(parents=True)
        (root / role / "__init__.py").write_text("")
    (root / "agent" / "a.py").write_text("import llmgw.server.api\n")
    (root / "agent" / "b.py").write_text("def f():\n    from llmgw.tui import app\n")
    (root / "agent" / "c.py").write_text("from ..server import store\n")
    (root / "tui" / "d.py").write_text("from llmgw import agent\n")
    (root / "server" / "e.py").write_text("from llmgw.wire import Register\nfrom . import e\n")
    assert crossings(root) == [
        "llmgw/agent/a.py: imports llmgw.server.api",
        "llmgw/agent/b.py: imports llmgw.tui",
        "llmgw/agent/b.py: imports llmgw.tui.app",
        "llmgw/agent/c.py: imports llmgw.server",
        "llmgw/agent/c.py: imports llmgw.server.store",
        "llmgw/tui/d.py: imports llmgw.agent",
    ]


AGENT_IMPORTS = """
import sys
import llmgw.cli, llmgw.agent.service, llmgw.agent.session, llmgw.agent.identity
import llmgw.agent.discovery
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
assert not heavy, f"the agent role imported {heavy}"
"""


def test_the_agent_role_does_not_load_the_web_stack_or_the_ui() -> None:
    # A fresh interpreter: this test process may have imported anything by now.
    proc = subprocess.run(
        [sys.executable, "-c", AGENT_IMPORTS, *HEAVY], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


# What only a feature some clusters use needs: loaded when it is used (the LDAP and OIDC
# sign-ins, reading a GGUF file), never by a control plane that starts and serves /v1.
SERVER_SPARED = ("ldap3", "authlib", "joserfc", "httpx", "gguf", "numpy")
SERVER_IMPORTS = """
import sys
import llmgw.cli, llmgw.server.process, llmgw.server.app
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
assert not loaded, f"the server role imported {loaded} on its own"
"""


def test_the_server_role_loads_what_a_feature_needs_only_when_it_is_used() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SERVER_IMPORTS, *SERVER_SPARED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def module_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package under ``root`` → the package's modules it imports.

    Importing ``a.b.c`` runs ``a`` and ``a.b`` too, so those count, except a module's own
    enclosing packages (already running when it is imported). Imports inside functions
    and under ``TYPE_CHECKING`` count: a cycle hidden there is still a knot.
    """
    modules: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        is_package = rel.name == "__init__"
        modules[".".join(rel.parts[:-1] if is_package else rel.parts)] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        edges: set[str] = set()
        for name in imported_modules(path.read_text(), module, is_package):
            while name and name not in modules:
                name = name.rpartition(".")[0]  # `from pkg import function`
            parts = name.split(".") if name else []
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in modules and not (module + ".").startswith(target + "."):
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere() -> None:
    assert cycles(module_graph(PACKAGE)) == []


def test_the_cycle_check_finds_a_cycle_through_a_package_and_a_late_import(
    tmp_path: Path,
) -> None:
    root = tmp_path / "llmgw"
    (root / "core").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "core" / "__init__.py").write_text("from llmgw.core.a import A\n")
    (root / "core" / "a.py").write_text("A = 1\n")  # a's own package: no edge back
    (root / "b.py").write_text("from llmgw.core import a\n")
    (root / "c.py").write_text("def f():\n    from llmgw import b\n")
    assert cycles(module_graph(root)) == []
    (root / "core" / "a.py").write_text("from llmgw.c import f\nA = 1\n")
    assert cycles(module_graph(root)) == [["llmgw.b", "llmgw.c", "llmgw.core", "llmgw.core.a"]]


def imports_under(root: Path, package: str) -> list[tuple[str, str]]:
    """(module, name) for every module ``name`` each module under ``package`` imports;
    ``root`` is the folder that holds the ``llmgw`` package."""
    found = []
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        found += [
            (module, n) for n in sorted(imported_modules(path.read_text(), module, is_package))
        ]
    return found


def forbidden(root: Path, package: str, bad: tuple[str, ...]) -> list[str]:
    """``module: imports name`` for each import under ``package`` of a ``bad`` module."""
    return [
        f"{module}: imports {name}"
        for module, name in imports_under(root, package)
        if any(name == b or name.startswith(b + ".") for b in bad)
    ]


# The server's core and its gateway: no web framework, and nothing of the composition
# root, the admin API or the pages, which are built on them and not the other way round.
CORE = ("store", "fleet", "catalog", "gateway", "ha")
CORE_MUST_NOT_IMPORT = (
    "starlette",
    "llmgw.server.app",
    "llmgw.server.api",
    "llmgw.server.pages",
    "llmgw.server.access",
)


def test_the_server_core_imports_neither_the_web_stack_nor_the_app() -> None:
    found = []
    for package in CORE:
        found += forbidden(PACKAGE.parent, f"llmgw.server.{package}", CORE_MUST_NOT_IMPORT)
    assert found == []


def test_the_api_and_the_pages_are_siblings() -> None:
    # Both call the services; neither goes through the other.
    assert forbidden(PACKAGE.parent, "llmgw.server.api", ("llmgw.server.pages",)) == []
    assert forbidden(PACKAGE.parent, "llmgw.server.pages", ("llmgw.server.api",)) == []


def test_the_server_never_imports_the_client() -> None:
    assert forbidden(PACKAGE.parent, "llmgw.server", ("llmgw.client",)) == []


def test_the_client_imports_no_role() -> None:
    bad = ("llmgw.agent", "llmgw.server", "llmgw.tui")
    assert forbidden(PACKAGE.parent, "llmgw.client", bad) == []


def test_the_forbidden_check_sees_late_and_relative_imports(tmp_path: Path) -> None:
    root = tmp_path / "llmgw"
    (root / "server" / "api").mkdir(parents=True)
    (root / "server" / "pages").mkdir(parents=True)
    (root / "server" / "api" / "a.py").write_text("def f():\n    from ..pages import site\n")
    (root / "server" / "pages" / "b.py").write_text("from llmgw.server.refusal import R\n")
    assert forbidden(root.parent, "llmgw.server.api", ("llmgw.server.pages",)) == [
        "llmgw.server.api.a: imports llmgw.server.pages",
        "llmgw.server.api.a: imports llmgw.server.pages.site",
    ]
    assert forbidden(root.parent, "llmgw.server.pages", ("llmgw.server.api",)) == []
