"""A one-line hint instead of a traceback when an entry point runs in a Python without the project's
packages: most often `python` outside the virtual environment that `make demo` makes.

An entry point imports this module before its first third-party import (``import utils.env_check``
above ``import torch``): the check runs on import. It imports nothing outside the standard library,
so that it runs where nothing else is installed.
"""
import importlib.util
import os
import sys

# What every run imports (requirements.txt), by import name.
REQUIRED = ("torch", "numpy", "h5py", "ruamel.yaml")
VENV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv")


def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing (ruamel.yaml)
        return False


def hint(missing, executable=sys.executable, venv=VENV):
    """The line that says what is missing from which Python, and what to run first."""
    where = os.path.relpath(venv) if not os.path.relpath(venv).startswith("..") else venv
    names = ", ".join(missing)
    if os.path.isdir(venv):
        step = (f"run `source {where}/bin/activate` first (the environment `make demo` made), or run the "
                f"command with {where}/bin/python")
    else:
        step = "run `make demo` first (it makes the environment .venv), then `source .venv/bin/activate`"
    return f"error: {names} {'is' if len(missing) == 1 else 'are'} not installed in this Python ({executable}): {step}."


def check_packages(names=REQUIRED):
    """Exit with status 2 and the hint when one of ``names`` is not importable."""
    missing = [name for name in names if not installed(name)]
    if missing:
        print(hint(missing), file=sys.stderr, flush=True)
        sys.exit(2)


check_packages()
