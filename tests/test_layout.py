"""The layout readers rely on: utils/ holds what a training run imports (plus the data CLIs and the
notebook's launcher), its modules import each other only along the edges listed here, and train.py's
main stays one screenful."""
import ast
import glob
import os

from conftest import ROOT

# Each module of utils/ and the modules of utils/ it may import. A new edge is a design decision:
# add it here with the reason, or pass the value in from the caller instead.
UTILS_IMPORTS = {
    "__init__": {"data_loader", "data_loader_gpu", "data_loader_dali"},  # the dispatcher, lazily
    "YParams": {"errors", "logging_utils"},
    "accumulation": set(),  # the configuration block goes to out.log only
    "benchy": {"conv3d", "errors", "flops", "noise"},  # the MFU, at the peak of the precision that runs; noisy trials
    "checkpoint": {"distributed", "files"},  # FSDP shards are gathered into one file
    "compiler": {"errors"},
    "conv3d": {"flops"},  # the precision the convolutions run in
    "convert_h5_to_npy": {"errors", "files"},
    "data_loader": {"symmetry", "errors", "signals"},  # workers shielded from the job's stop signals
    "data_loader_dali": {"convert_h5_to_npy", "data_loader", "errors", "symmetry"},  # reads what the converter writes
    "data_loader_gpu": {"symmetry", "data_loader", "errors"},  # the native loaders' crop specification
    "distributed": {"errors"},
    "halo": set(),  # receives the mesh from the caller
    "env_check": set(),  # the standard library alone: it runs where nothing else is installed
    "errors": set(),
    "files": set(),
    "estimate": {"errors", "flops", "optim", "YParams"},  # the run's FLOPs; the rate of its own step, in its precision; the demo's, for the refusal
    "flops": {"errors"},
    "generate_data": {"convert_h5_to_npy", "errors", "files"},  # it also writes the .npy copies
    "logging_utils": set(),
    "losses": set(),
    "metrics": set(),
    "noise": set(),
    "optim": {"errors"},
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
                                timeout=120)
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
