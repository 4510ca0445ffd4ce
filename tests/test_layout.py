"""The layout readers rely on: utils/ holds what a training run imports (plus the data CLIs and the
notebook's launcher), its modules import each other only along the edges listed here, and train.py's
main stays one screenful."""
import ast
import glob
import os
import re
import time

import pytest

from conftest import ROOT, TIMEOUT_FACTOR, run_with_estimate, timeout_for

# Each module of utils/ and the modules of utils/ it may import. A new edge is a design decision:
# add it here with the reason, or pass the value in from the caller instead.
UTILS_IMPORTS = {
    "__init__": {"data_loader", "data_loader_gpu", "data_loader_dali"},  # the dispatcher, lazily
    "YParams": {"errors", "logging_utils"},
    "accumulation": set(),  # the configuration block goes to out.log only
    "benchy": {"conv3d", "errors", "flops", "noise"},  # the MFU, at the peak of the precision that runs; noisy trials
    "checkpoint": {"distributed", "files", "out_of_memory"},  # FSDP shards are gathered into one file; an OOM explained
    "compiler": {"errors"},
    "conv3d": {"flops"},  # the precision the convolutions run in
    "convert_h5_to_npy": {"errors", "files"},
    "data_loader": {"symmetry", "errors", "signals"},  # workers shielded from the job's stop signals
    "data_loader_dali": {"convert_h5_to_npy", "data_loader", "errors", "symmetry"},  # reads what the converter writes
    "data_loader_gpu": {"symmetry", "data_loader", "errors"},  # the native loaders' crop specification
    "distributed": {"errors", "out_of_memory"},  # NCCL's own out-of-memory error is no lost rank
    "halo": {"exact_forms"},  # receives the mesh from the caller; a block is convolved in its layer's form
    "exact_forms": {"errors"},  # the switch's refusal; the timing's process group is torch.distributed's own
    "env_check": set(),  # the standard library alone: it runs where nothing else is installed
    "errors": set(),
    "files": set(),
    "estimate": {"conv3d", "errors", "flops", "optim", "YParams"},  # the run's FLOPs; the rate of its own step, in its precision; the demo's, for the refusal; whether this CPU emulates the precision
    "flops": {"errors"},
    "generate_data": {"convert_h5_to_npy", "errors", "files"},  # it also writes the .npy copies
    "logging_utils": set(),
    "losses": set(),
    "metrics": set(),
    "noise": set(),
    "optim": {"errors"},
    "out_of_memory": {"errors"},  # a RankError: the rank that ran out prints its own paragraph
    "preview": {"files"},
    "profiling": {"errors"},
    "prefetch": {"__init__"},  # which loaders are the host loaders it copies ahead
    "progress": set(),
    "runs": {"YParams", "errors", "files"},  # config.yaml read and written as the configs are
    "signals": {"distributed", "errors"},  # the ranks agree to stop at the same step; a second Ctrl-C exits at once
    "step_spread": set(),
    "symmetry": {"errors"},
    "tensorboard_launch": {"errors"},
}


def utils_imports(path):
    tree = ast.parse(open(path).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "utils":
            names = [node.module.split(".")[1]] if "." in node.module else [alias.name for alias in node.names]
            # `from utils import NAME` takes a module, or a name the package itself (__init__) defines
            found.update(name if os.path.exists(os.path.join(ROOT, "utils", f"{name}.py")) else "__init__"
                         for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("utils."))
    return found


def test_utils_holds_what_a_run_imports_and_nothing_else():
    modules = {os.path.basename(path)[:-3] for path in glob.glob(os.path.join(ROOT, "utils", "*.py"))}
    assert modules == set(UTILS_IMPORTS)


def test_utils_modules_import_each_other_only_along_the_listed_edges():
    for name, allowed in UTILS_IMPORTS.items():
        imported = utils_imports(os.path.join(ROOT, "utils", f"{name}.py")) - {name}
        assert imported <= allowed, f"utils/{name}.py imports {sorted(imported - allowed)} sideways"


def test_utils_imports_point_downward():
    """The listed edges have no circle: each module imports only modules below it."""
    placed, left = set(), dict(UTILS_IMPORTS)
    while left:
        ready = {name for name, imports in left.items() if imports - {name} <= placed}
        assert ready, f"the edges of {sorted(left)} go round in a circle"
        placed |= ready
        left = {name: imports for name, imports in left.items() if name not in ready}


def docstring_map():
    """``{module: concern}`` from utils/__init__.py's docstring: an indented ``module   what it does`` line
    under its concern's heading, and how often each module is named."""
    concern, found = None, []
    for line in ast.get_docstring(ast.parse(open(os.path.join(ROOT, "utils", "__init__.py")).read())).splitlines():
        entry = re.match(r"    (\w+)  +\S", line)
        if entry:
            found.append((entry.group(1), concern))
        elif line and not line.startswith(" "):
            concern = line.lower()
    return found


def test_the_map_of_utils_names_every_module_once_and_the_docs_point_to_it():
    """A module added to utils/ goes into the docstring's map (utils/__init__.py), under its concern; the map
    names no module that does not exist. docs/02-single-device.md's code overview points to that map rather
    than repeating it."""
    modules = {os.path.basename(path)[:-3] for path in glob.glob(os.path.join(ROOT, "utils", "*.py"))} - {"__init__"}
    named = [module for module, _ in docstring_map()]
    problems = [f"utils/__init__.py's docstring maps no utils/{m}.py: add the line '    {m:<21}what it does' under "
                "its concern" for m in sorted(modules - set(named))]
    problems += [f"utils/__init__.py's docstring maps {m}, which is not in utils/: remove it"
                 for m in sorted(set(named) - modules)]
    problems += [f"utils/__init__.py's docstring names {m} twice" for m in sorted({m for m in named if named.count(m) > 1})]
    assert not problems, "\n".join(problems)
    text = open(os.path.join(ROOT, "docs", "02-single-device.md")).read()
    overview = text.split("## Model, data and code overview")[1].split("\n#")[0]
    assert "](../utils/__init__.py)" in overview


def test_train_py_main_is_one_screenful():
    tree = ast.parse(open(os.path.join(ROOT, "train.py")).read())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    loop = next(node for node in ast.walk(main) if isinstance(node, ast.For))
    assert main.end_lineno - main.lineno + 1 <= 80
    assert loop.end_lineno - loop.lineno + 1 <= 25
    inner = [node for statement in main.body for node in ast.walk(statement)]
    assert not [node for node in inner if isinstance(node, (ast.FunctionDef, ast.Lambda))]  # no closures


def test_library_modules_answer_help_with_what_they_are():
    """`python -m utils.tensorboard_launch --help` and `python -m benchmarks.trials --help` once printed nothing."""
    import subprocess
    import sys

    for module in ("utils.tensorboard_launch", "benchmarks.trials"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=timeout_for(120))
        assert result.returncode == 0 and f"{module} has no command line of its own" in result.stdout, module
        assert len(result.stdout.splitlines()) > 3  # the module's docstring first


def test_the_tests_shared_helpers_are_defined_once_in_conftest():
    """A helper of tests/conftest.py (free_port, snapshot, ...) is imported by the test modules that use it,
    never defined again beside it."""
    def functions(path):
        with open(path) as f:
            return {node.name for node in ast.parse(f.read()).body if isinstance(node, ast.FunctionDef)}
    shared = functions(os.path.join(ROOT, "tests", "conftest.py"))
    again = {os.path.basename(path): sorted(functions(path) & shared)
             for path in glob.glob(os.path.join(ROOT, "tests", "*.py")) if not path.endswith("conftest.py")}
    assert {name: helpers for name, helpers in again.items() if helpers} == {}


# Timeouts in the tests that are not limits on a hang but what the test checks: they stay as numbers.
LIMITS_UNDER_TEST = {
    ("test_benchmark_profiles.py", "test_nsys_is_probed_once_before_the_rungs"): "probe_nsys's own timeout",
    ("test_benchmark_profiles.py", "test_nsys_and_its_importer_together_end_within_the_limit"): "try_nsys's own timeout",
    ("test_preflight.py", "test_a_run_past_its_limit_ends_with_all_its_children"): "common.run's own timeout",
    ("test_signals.py", "test_ctrl_c_during_set_up_prints_one_line_and_writes_nothing"): "ends before the 30-s step",
    ("test_layout.py", "test_a_train_run_may_take_what_it_estimates_for_itself"): "run_with_estimate's own limit",
}


def test_the_tests_wait_for_hangs_not_for_slowness():
    """A timeout in a test is a number only where the test checks that limit; every other one is
    conftest.timeout_for(seconds on an idle machine), so that a loaded machine makes the suite slower, not red."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        tree = ast.parse(open(path).read())
        for function in [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]:
            arguments = function.args
            defaults = [(arg.arg, value) for arg, value in
                        zip(arguments.args[len(arguments.args) - len(arguments.defaults):], arguments.defaults)]
            defaults += [(arg.arg, value) for arg, value in zip(arguments.kwonlyargs, arguments.kw_defaults) if value]
            keywords = [(node.arg, node.value) for node in ast.walk(function) if isinstance(node, ast.keyword)]
            for name, value in defaults + keywords:
                if name == "timeout" and isinstance(value, ast.Constant):
                    found.append((os.path.basename(path), function.name, value.lineno, value.value))
    numbers = [(*where, line, seconds) for *where, line, seconds in found if tuple(where) not in LIMITS_UNDER_TEST]
    assert not numbers, "\n".join(f"tests/{name}:{line} ({function}) waits timeout={seconds}: write "
                                   f"timeout=timeout_for({seconds}) (from conftest), or list it in LIMITS_UNDER_TEST"
                                   for name, function, line, seconds in numbers)
    assert {tuple(where) for *where, _, _ in found} == set(LIMITS_UNDER_TEST)  # no stale entry


@pytest.mark.slow
def test_a_train_run_may_take_what_it_estimates_for_itself():
    """A run that logs train.py's estimate (utils/estimate.py's words) may run TIMEOUT_FACTOR times as long as it
    says, past the limit it was given; one that says nothing is ended at that limit."""
    import subprocess
    import sys

    from utils.estimate import format_duration

    def sleeper(said):
        return [sys.executable, "-c", f"import time; print({said!r}, flush=True); time.sleep(8)"]
    says = f"--config=demo would train for about {format_duration(8 / TIMEOUT_FACTOR + 3)} on this CPU: 1 epoch"
    assert run_with_estimate(sleeper(says), timeout=5).returncode == 0
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_with_estimate(sleeper("Estimated time: seconds"), timeout=5)
    assert time.monotonic() - started < 8
