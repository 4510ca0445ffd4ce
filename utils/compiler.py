"""Whether ``torch.compile`` can build here, asked before a run relies on it.

Inductor and Triton compile small C wrappers that include ``Python.h`` the first time a compiled
function runs. Without a C compiler or the Python headers that first call fails deep inside PyTorch,
minutes into a job and with a long traceback; :func:`compile_problem` finds it in a fraction of a
second, so that ``train.py --jit_mode=compile`` is refused before anything is written and the GPU
suite skips its compile rungs with the reason.
"""
import os
import shutil
import subprocess
import sysconfig
import tempfile

from utils.errors import UserError


def compile_problem():
    """Why torch.compile cannot build its wrappers here (None when it can). Triton and Inductor
    compile small C files that include ``Python.h``: one such file is compiled here (syntax only,
    a fraction of a second) with $CC or the first of cc, gcc and clang on PATH."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    include = sysconfig.get_paths()["include"]
    fix = "install gcc and the Python headers (python3-dev), or run without --jit_mode=compile"
    if not compiler:
        return f"torch.compile needs a C compiler (cc, gcc or clang on PATH, or $CC) and finds none: {fix}"
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"torch.compile needs the Python headers, and {include}/Python.h does not exist: {fix}"
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe.c")
        with open(source, "w") as f:
            f.write("#include <Python.h>\nint main(void) { return Py_IsInitialized(); }\n")
        try:
            result = subprocess.run([compiler, "-fsyntax-only", f"-I{include}", source], capture_output=True,
                                    text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"torch.compile needs a working C compiler, and {compiler} did not run ({error}): {fix}"
    if result.returncode != 0:
        return (f"torch.compile needs a C compiler that builds against Python.h, and {compiler} failed: "
                f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.returncode}: {fix}")
    return None


def check_compiler(params):
    """Refuse ``--jit_mode=compile`` where torch.compile cannot build its wrappers, with the fix."""
    if params.jit_mode == "compile":
        problem = compile_problem()
        if problem:
            raise UserError(f"--jit_mode=compile cannot run here: {problem}.")
