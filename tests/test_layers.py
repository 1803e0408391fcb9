"""The import layers hold: ``common/`` imports no role, the role configs (``common/config/``) are pure
dataclass modules, only the launcher imports ``launcher``, actors and learner never
import each other, envhub imports no other role, the learner reaches envhub only through its HTTP client
and the actors only through its client surface, and neither the packages nor the modules import each other around a
cycle (docs/architecture.md draws it). Every import counts, those inside functions too."""

import ast
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROLES = ("actors", "learner", "envhub")
ROLE_CONFIGS = tuple(f"common.config.{role}" for role in ROLES)
LAUNCHER = "launcher"


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the repo
    line: int
    module: str  # the module imported, resolved: ``from common import net`` imports ``common.net``
    statement: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module} ({self.statement})"


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_repo_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_in(source: str, path: str, module: str, is_package: bool = False) -> Iterator[Import]:
    """Every import statement of ``source``, wherever it sits, as the modules it imports."""
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name, ast.unparse(node))
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(node, module, is_package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield Import(path, node.lineno, submodule if is_repo_module(submodule) else base, ast.unparse(node))


def absolute_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module ``from X import ...`` names, with a relative ``X`` resolved against ``module``."""
    if not node.level:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))


@cache
def imports_of_file(path: Path) -> tuple[Import, ...]:
    relative = str(path.relative_to(REPO))
    found = imports_in(path.read_text(), relative, module_of(path), path.name == "__init__.py")
    return tuple(sorted(set(found), key=lambda imp: (imp.line, imp.module)))  # one per module a statement names


def files_under(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def is_in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def violations(files: list[Path], banned: Callable[[str], bool]) -> list[str]:
    """Each import of ``files`` whose module is ``banned``, as ``path:line imports module (statement)``."""
    return [str(imp) for path in files for imp in imports_of_file(path) if banned(imp.module)]


def file_of(module: str) -> Path:
    base = REPO.joinpath(*module.split("."))
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def role_free_common_modules() -> set[str]:
    """``common`` modules whose imports, followed through ``common``, reach no role module."""
    modules = {module_of(p): p for p in files_under("common")}

    def reaches_role(start: str) -> bool:
        seen, pending = {start}, [start]
        while pending:
            for target in (imp.module for imp in imports_of_file(modules[pending.pop()])):
                if is_in(target, *ROLES):
                    return True
                if target in modules and target not in seen:
                    seen.add(target)
                    pending.append(target)
        return False

    return {m for m in modules if not reaches_role(m)}


def test_the_scan_sees_imports_inside_functions_and_names_submodules():
    source = "from common import net\ndef f():\n    from learner.checkpoint import save_checkpoint\n"
    found = [imp.module for imp in imports_in(source, "x.py", "common.x")]
    assert found == ["common.net", "learner.checkpoint"]
    assert len(files_under(*ROLES, "common")) > 50


def test_common_imports_no_role():
    # The role configs live in common/config/ for this: loading the run config loads no role's code.
    found = violations(files_under("common"), lambda module: is_in(module, *ROLES))
    assert not found, "common/ is imported by every role and imports none:\n" + "\n".join(found)


def test_role_config_modules_are_pure_dataclass_modules():
    allowed_common = role_free_common_modules()

    def impure(module: str) -> bool:
        top = module.split(".")[0]
        return not (top in sys.stdlib_module_names or module in allowed_common)

    found = violations([file_of(m) for m in ROLE_CONFIGS], impure)
    assert not found, ("a role config module imports only the standard library and common modules that "
                       "import no role (common/config/__init__.py composes them):\n" + "\n".join(found))


def test_no_role_imports_the_launcher():
    files = files_under(*ROLES, "common")
    found = violations(files, lambda module: is_in(module, LAUNCHER))
    assert not found, "only launch.py and launcher/ import launcher:\n" + "\n".join(found)


def test_actors_and_learner_do_not_import_each_other():
    found = violations(files_under("actors"), lambda module: is_in(module, "learner"))
    found += violations(files_under("learner"), lambda module: is_in(module, "actors"))
    assert not found, "actors and learner meet only through common/:\n" + "\n".join(found)


def test_the_learner_reaches_envhub_only_through_its_client():
    # Task lists come over HTTP (GET /envs/{id}/tasks): the learner's node needs no env's code or data.
    found = violations(files_under("learner"), lambda module: is_in(module, "envhub") and module != "envhub.client")
    assert not found, "the learner talks to envhub over HTTP (envhub.client) only:\n" + "\n".join(found)


def test_envhub_imports_no_other_role():
    # envhub is a service the others call over HTTP: it runs on nodes with no learner or actor code.
    found = violations(files_under("envhub"), lambda module: is_in(module, "actors", "learner"))
    assert not found, "envhub imports common/ only:\n" + "\n".join(found)


ENVHUB_CLIENT_SURFACE = ("envhub.client", "envhub.channel_client", "envhub.base", "envhub.actions")
"""What an actor may import from envhub: the two clients, the types they answer with (base) and the
reply parsing every env shares (actions); never an env, the server or its data."""


def test_actors_reach_envhub_only_through_its_client_surface():
    found = violations(files_under("actors"),
                       lambda module: is_in(module, "envhub") and module not in ENVHUB_CLIENT_SURFACE)
    assert not found, f"actors use envhub through {', '.join(ENVHUB_CLIENT_SURFACE)} only:\n" + "\n".join(found)


def package_graph() -> dict[str, set[str]]:
    """Which top-level packages import which (``launcher/`` sits above them all)."""
    graph: dict[str, set[str]] = {package: set() for package in (*ROLES, "common")}
    for path in files_under(*ROLES, "common"):
        source = module_of(path).split(".")[0]
        graph[source] |= {imp.module.split(".")[0] for imp in imports_of_file(path)} & set(graph) - {source}
    return graph


def test_the_packages_import_each_other_without_a_cycle():
    graph, order = package_graph(), []
    while graph:  # peel packages that import nothing left; a cycle leaves some that all import each other
        leaves = sorted(package for package, targets in graph.items() if not targets & set(graph))
        assert leaves, f"import cycle among {sorted(graph)}: {graph}"
        order += leaves
        graph = {package: targets for package, targets in graph.items() if package not in leaves}
    assert order.index("common") < order.index("envhub") < min(order.index("actors"), order.index("learner"))


def module_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``graph`` (module -> modules it imports), as the modules around it; None if none."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every import was followed
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (loop := visit(target)):
                return loop
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (loop := visit(module)):
            return loop
    return None


def test_the_scan_finds_a_module_cycle():
    assert module_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert module_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_imports_itself_back():
    # A loop makes import order matter (the first module imported sees the other half-built) and
    # hides which of the two is the lower layer; type-only imports count, they are the same coupling.
    files = {module_of(p): p for p in files_under(*ROLES, "common", LAUNCHER)}
    graph = {m: {i.module for i in imports_of_file(p)} & set(files) - {m} for m, p in files.items()}
    loop = module_cycle(graph)
    assert loop is None, "modules that import each other around a loop: " + " -> ".join(loop or [])
