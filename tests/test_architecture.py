"""The layout's promises, checked: no import cycle in jdist/, and each runtime loads only its own code.

jdist runs in four places (docs/architecture.md): the notebook kernel (``jdist.kernel``), the ranks
(``jdist.rank``), the Jupyter server (``jdist.server``) and the browser (``labextension/``), plus
small shared modules any of them uses. The kernel never imports the rank runtime and the ranks
never import kernel code; the server imports neither.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "jdist"
RUNTIMES = ("jdist.kernel", "jdist.rank", "jdist.server", "jdist.cli")
#: What each part of the package may import, besides the shared modules (the ``jdist`` command is
#: another front end of the kernel side: it drives the cluster and the supervisor from a terminal).
ALLOWED = {"jdist.kernel": {"jdist.kernel"}, "jdist.rank": {"jdist.rank"}, "jdist.server": {"jdist.server"},
           "jdist.cli": {"jdist.cli", "jdist.kernel"}, "shared": set()}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str) -> set[str]:
    """The jdist modules ``name`` imports, anywhere in it (function-local imports included; not
    imports under ``if TYPE_CHECKING``, which never run)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not _type_checking_only(node, parents):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not _type_checking_only(node, parents):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def part(name: str) -> str:
    if name == "jdist.__main__":  # `python -m jdist` is the jdist command
        return "jdist.cli"
    return next((r for r in RUNTIMES if name == r or name.startswith(r + ".")), "shared")


def test_the_package_has_its_parts():
    assert {part(m) for m in MODULES} == {"jdist.kernel", "jdist.rank", "jdist.server", "jdist.cli", "shared"}


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_each_runtime_imports_only_itself_and_the_shared_modules():
    crossing = []
    for name, targets in GRAPH.items():
        mine = part(name)
        for target in targets:
            theirs = part(target)
            if theirs != "shared" and theirs not in ALLOWED[mine]:
                crossing.append(f"{name} -> {target}")
    assert crossing == [], "imports across runtimes:\n" + "\n".join(sorted(crossing))


def _loaded(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_kernels_jdist_loads_no_rank_runtime_and_no_torch():
    loaded = _loaded("import jdist\n"
                     "from jdist.kernel import magics, cluster, supervise, sinks, recovery, actions, dashboard\n"
                     "jdist.last_run, jdist.runs, jdist.Run, jdist.AUTO_METRICS")
    assert not {m for m in loaded if m.startswith("jdist.rank")}, "the kernel loaded the rank runtime"
    assert "torch" not in loaded and "jdist.kernel.magics" in loaded


def test_the_command_loads_no_rank_runtime_and_no_torch():
    loaded = _loaded("import jdist.cli, jdist.cli.run, jdist.cli.runs, jdist.cli.view\n"
                     "from jdist.cli import parser; parser()")
    assert not {m for m in loaded if m.startswith(("jdist.rank", "jdist.server"))}
    assert "torch" not in loaded and "jdist.kernel.cluster" not in loaded  # `jdist runs` starts fast


def test_the_ranks_jdist_loads_no_kernel_or_server_code():
    loaded = _loaded("import jdist\n"
                     "from jdist.rank import rpc, api, training, checkpoint, data, guard\n"
                     "from jdist.rank.backends import ddp, fsdp, horovod\n"
                     "jdist.prepare, jdist.log, jdist.backward, jdist.save_checkpoint")
    assert not {m for m in loaded if m.startswith(("jdist.kernel", "jdist.server"))}, "the ranks loaded kernel code"
    assert "jdist.rank.rpc" in loaded and "torch" in loaded


def test_the_server_loads_neither_runtime():
    loaded = _loaded("import jdist.server, jdist.server.manager, jdist.server.handlers")
    assert not {m for m in loaded if m.startswith(("jdist.kernel", "jdist.rank"))}
