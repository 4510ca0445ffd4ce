"""The lines the GPU suite's headline writes into its summary.txt, read from its tools' results.

benchmarks/suite/gpu_suite.sh calls these as it goes, and adds each printed line to summary.txt::

    python -m benchmarks.suite.summary software            # the header: the device, Python and the libraries
    python -m benchmarks.suite.summary rung NAME FILE      # one rung's numbers (benchmarks/ladder.py --measure_rung)
    python -m benchmarks.suite.summary original FILE...    # the original tutorial's runs (benchmarks/original.py)
    python -m benchmarks.suite.summary layers FILE...      # why the step layer by layer measured nothing, if it did not
    python -m benchmarks.suite.summary anchor              # the committed run that the anchor repeats, on this device

A file that a failed step did not write (the shell's unmatched ``DIR/*.json``) adds nothing: the step's own line
in summary.txt already says that it failed.
"""
import json
import os
import sys


def read(paths):
    """The JSON of each of ``paths`` that exists."""
    for path in paths:
        if os.path.isfile(path):
            with open(path) as f:
                yield json.load(f)


def software():
    """What every number below depends on: the device, Python's version and the libraries'."""
    import platform

    import torch

    from benchmarks.common import device_name, software as libraries

    yield f"device: {device_name(torch.cuda.is_available())}"
    yield f"python: {platform.python_version()}"
    for key, value in libraries().items():
        yield f"{key}: {value}"


def rung(name, path):
    """A rung's FULL, SYNTHETIC and IO samples/s, MFU, peak memory and exact forms."""
    for result in read([path]):
        mfu, peak = (result.get("mfu") or {}).get("full"), result.get("peak_mem_gb")
        yield (f"{name}: FULL {result['full']:.1f}, SYNTHETIC {result['synthetic']:.1f}, IO {result['io']:.1f} "
               "samples/s" + (f", MFU {mfu:.1%}" if mfu is not None else "")
               + (f", peak {peak:.1f} GB" if peak is not None else "") + f", exact forms {result['exact_forms']}")


def original(*paths):
    """Each of the original's runs: its samples/s (the epochs after the first), or that it measured none and why."""
    for result in read(paths):
        for run in result["original_runs"]:
            rate, error = run.get("samples_per_s"), run.get("error")
            yield (f"original, {run['name']}: " + (f"{rate:.1f} samples/s" if rate else "not measured")
                   + (f" ({error})" if error else ""))


def layers(*paths):
    """The in-step tables' warnings (a profiler that traced no kernel, rows that do not add up), each once."""
    warnings = {table["warning"] for result in read(paths) for table in result["in_step"].values()
                if table.get("warning")}
    for warning in sorted(warnings):
        yield f"layers: {warning}"


def anchor():
    """The FULL samples/s that the committed ladder measured for the anchor's rung on this kind of device."""
    import torch

    from benchmarks.common import device_name, device_slug
    from benchmarks.suite.plan import EAGER_CHANNELS_LAST, measured_full

    try:
        gpu = device_slug(device_name(torch.cuda.is_available()))
        committed = f"FULL {measured_full(EAGER_CHANNELS_LAST, gpu=gpu):.1f}"
    except LookupError:
        committed = "none in benchmarks/results/"
    yield f"anchor: the committed {EAGER_CHANNELS_LAST} on this device: {committed}"


def main(argv=None):
    what, *arguments = sys.argv[1:] if argv is None else argv
    lines = {"software": software, "rung": rung, "original": original, "layers": layers, "anchor": anchor}[what]
    for line in lines(*arguments):
        print(line)


if __name__ == "__main__":
    main()
