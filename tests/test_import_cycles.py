"""No import circle among the project's modules: what two modules share lives in a third that both import
(benchmarks/common.py for the benchmarks), so that each can be read, and imported, without the other.

An edge is any import of a project module, at the top of a file or inside a function: a deferred import
hides a circle from Python's start-up, not from the reader."""
import ast
import glob
import os

from conftest import ROOT

PACKAGES = ("benchmarks", "utils", "networks", "figures")
SCRIPTS = ("train.py", "train_graph.py")


def project_modules():
    """``{dotted name: path}`` of every module of the project (tests excluded: nothing imports them)."""
    paths = [os.path.join(ROOT, script) for script in SCRIPTS]
    for package in PACKAGES:  # sub-packages too (benchmarks/suite/)
        paths += glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True)
    modules = {}
    for path in paths:
        name = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
        modules[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return modules


def imports(path, modules):
    """The project modules that the file at ``path`` imports anywhere in it. ``from pkg import name`` is the
    module ``pkg.name`` where there is one, else the package ``pkg`` (a name its __init__ defines)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
    return found


def import_graph():
    modules = project_modules()
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


def circles(graph):
    """One circle per strongly connected group of modules (Tarjan's algorithm), each as a closed path."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [closed_path(graph, group) for group in groups]


def closed_path(graph, group):
    """A path through ``group`` that comes back to where it started: "a -> b -> c -> a"."""
    start = min(group)
    path, seen = [start], {start}
    while True:
        following = sorted(target for target in graph[path[-1]] if target in group)
        back = start if start in following else None
        if back and len(path) > 1:
            return " -> ".join(path + [start])
        ahead = [target for target in following if target not in seen]
        if not ahead:
            return " -> ".join(path + [following[0]])
        path.append(ahead[0])
        seen.add(ahead[0])


def test_the_project_has_no_import_circle():
    graph = import_graph()
    assert "benchmarks.common" in graph["benchmarks.ladder"]  # the graph sees the benchmarks' shared module
    assert "benchmarks.ladder" in graph["benchmarks.suite.plan"]  # and the sub-packages' modules
    assert circles(graph) == []


def test_the_learners_tools_do_not_import_the_gpu_suite():
    """benchmarks/suite/ (the GPU suite's machinery) runs the tools of benchmarks/; no tool needs it."""
    graph = import_graph()
    suite = {name for name in graph if name.startswith("benchmarks.suite")}
    assert "benchmarks.suite.plan" in suite
    assert {name: sorted(graph[name] & suite) for name in graph
            if name not in suite and graph[name] & suite} == {}


def test_the_check_finds_a_circle_through_deferred_imports():
    # The circle this check was written for: ladder -> preflight -> profiles -> ladder, the last two imports
    # inside functions.
    graph = {"ladder": {"preflight", "common"}, "preflight": {"profiles"}, "profiles": {"ladder", "common"},
             "common": set()}
    assert circles(graph) == ["ladder -> preflight -> profiles -> ladder"]
    graph["profiles"] = {"common"}
    assert circles(graph) == []


def test_a_deferred_import_is_an_edge(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("import os\n\ndef late():\n    from benchmarks.ladder import rungs_for\n"
                      "    from utils import noise, get_data_loader_distributed\n")
    modules = project_modules()
    assert imports(str(source), modules) == {"benchmarks.ladder", "utils.noise", "utils"}
