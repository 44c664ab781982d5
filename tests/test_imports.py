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
