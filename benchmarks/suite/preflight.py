"""The GPU suite's first command: in about 30 seconds, what every later stage relies on.

    python -m benchmarks.suite.preflight                 # the stage benchmarks/suite/gpu_suite.sh preflight runs

It prints each check's line and rewrites ``preflight.json`` as each check finishes (a preflight
stopped at its limit keeps what it found), in ``runs/benchmarks/preflight/`` (ignored by git, as
every benchmark tool's results) or the folder ``--out_dir`` names (the suite's results folder);
the last line says where. The facts that decide what the later stages of
``benchmarks/suite/gpu_suite.sh`` do are re-derived by those stages in seconds (the compiler, DALI,
where the convolutions run), since a later command may find a bare machine; the nsys probe's
answer travels when its preflight.json is carried (``--plan`` says how):

- torch, CUDA and cuDNN versions, the GPU's name and free memory;
- the runtime requirements (requirements.txt) importable, which train.py needs;
- free space in ``/dev/shm`` (the host loaders' workers pass their batches through it);
- a C compiler and ``Python.h``, which torch.compile needs (Triton and Inductor build small C
  wrappers): without them the compile rungs and tests are skipped with a line that says why;
- a bf16 3-D convolution, forward and backward, on the GPU, with its time, and where the 16-bit
  3-D convolutions run (cuDNN or a several times slower fallback) and whether float32 ones run
  as TF32 (the ladder gives a slow rung one short trial, and measures MFU against the peak of the
  precision that runs);
- a two-step torch-profiler trace that must hold CUDA kernel events (CUPTI records none on some
  sandboxed machines: then the profiles stage would show no device time);
- ``nsys``: found or not, and whether it writes a report of a short CUDA program within
  ``--nsys_timeout`` seconds, its importer included (its process group is ended at the limit). An
  nsys with no ``QdstrmImporter`` beside it (a target-only copy, such as the one inside Nsight
  Compute's folder) is not tried: it writes raw ``.qdstrm`` captures, never a report;
- NVIDIA DALI importable or not (the DALI rung and tests need its install command first).

On a machine without a GPU it runs the CPU half (versions, /dev/shm, compiler, a CPU profiler
trace, nsys found, DALI) and names each check it skipped. The exit status is 0 when every check
that ran passed and the requirements import; a missing optional piece (nsys, DALI, the compiler)
is reported, not failed.
"""
import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time

import torch

from benchmarks.common import ROOT, add_output_options, relative, results_folder, user_folder
from utils.compiler import compile_problem
from utils.conv3d import AMP_DTYPES, conv_backends, cudnn_text, known_issues, on_cudnn, running_precision
from utils.data_loader import shm_free_bytes
from utils.errors import UserError, exit_on_user_error

def conv3d_check(device):
    """A bf16 3-D convolution (the U-Net's second level: 64 -> 128 channels, 32^3, batch 8),
    forward and backward on ``device``; the time of the second call in ms."""
    x = torch.randn(8, 64, 32, 32, 32, device=device, requires_grad=True)
    conv = torch.nn.Conv3d(64, 128, 4, stride=2, padding=1).to(device)
    times = []
    for _ in range(2):  # the first call chooses cuDNN's algorithms
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = conv(x)
        out.float().sum().backward()
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return {"ok": bool(torch.isfinite(x.grad).all()), "ms": round(times[-1], 2)}


def profiler_check(device):
    """Two profiled steps of a small convolution; the trace's CUDA kernel and CPU op counts."""
    model = torch.nn.Conv3d(4, 8, 3, padding=1).to(device)
    x = torch.randn(2, 4, 16, 16, 16, device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(2):
                model(x).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        profiler.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sum(e.get("cat") == "kernel" for e in events)
    cpu_ops = sum(e.get("cat") == "cpu_op" for e in events)
    return {"kernels": kernels, "cpu_ops": cpu_ops, "ok": kernels > 0 if device.type == "cuda" else cpu_ops > 0}


def missing_requirements(path=os.path.join(ROOT, "requirements.txt")):
    """The runtime requirements (requirements.txt) that cannot be imported here: train.py needs them all."""
    modules = {"pyyaml": "yaml"}  # distribution names that differ from the module's
    missing = []
    with open(path) as f:
        for line in f:
            name = re.split(r"[<>=!~;\[ ]", line.split("#", 1)[0].strip(), maxsplit=1)[0]
            if not name:
                continue
            module = modules.get(name.lower(), name)
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # a dotted name whose parent is missing
                found = False
            if not found:
                missing.append(name)
    return missing


def dali_version():
    try:
        if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
            return None
        import nvidia.dali
        return nvidia.dali.__version__
    except ImportError:
        return None


def conv3d_findings(device):
    """Where this PyTorch and cuDNN put the U-Net's 16-bit 3-D convolutions (the dispatcher's choice,
    microseconds, nothing computed) and whether they turn TF32 off for them: the ladder and layers
    rungs whose convolutions leave cuDNN run several times slower (utils/conv3d.py)."""
    findings = {}
    for precision, dtype in AMP_DTYPES.items():
        backends = conv_backends(device, dtype)
        findings[precision] = {"backends": list(backends), "on_cudnn": on_cudnn(backends),
                               "known_issues": [issue.source for issue in known_issues(
                                   torch.__version__, torch.backends.cudnn.version(), precision)]}
    findings["tf32_runs_as"] = running_precision("none", True, device)
    return findings


NO_IMPORTER = ("a target-only copy, with no QdstrmImporter beside it: it writes raw .qdstrm captures, never a "
               "report (not tried)")


def run_checks(nsys_timeout=45, work_dir=None, done=lambda facts, key: None):
    """Every check this machine can run, as a dict; ``skipped`` names the rest, with the reason.
    ``done(facts, key)`` is called as each check finishes (the preflight writes and prints it then)."""
    from benchmarks.nsight import find_nsys, importers
    from benchmarks.profiles import probe_nsys

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if cuda else None, "python": sys.version.split()[0],
             "gpu": torch.cuda.get_device_name(0) if cuda else None, "skipped": {}}
    done(facts, "torch")

    def check(key, value):
        facts[key] = value
        done(facts, key)

    def skip(what, why):
        facts["skipped"][what] = why
        done(facts, "skipped")

    if cuda:
        free, total = torch.cuda.mem_get_info(0)
        facts["gpu_memory_free_gb"] = round(free / 1e9, 1)
        check("gpu_memory_total_gb", round(total / 1e9, 1))
    else:
        skip("GPU name and free memory", "no CUDA GPU")
    shm = shm_free_bytes()
    check("shm_free_gb", None if shm is None else round(shm / 1e9, 2))
    check("missing_requirements", missing_requirements())
    check("compile_problem", compile_problem())
    if cuda:
        check("conv3d_bf16", conv3d_check(device))
        check("conv3d", conv3d_findings(device))
    else:
        skip("a bf16 Conv3d forward and backward on the GPU", "no CUDA GPU")
        skip("where the 16-bit 3-D convolutions run (cuDNN or not)", "no CUDA GPU")
    check("profiler", profiler_check(device))
    if not cuda:
        skip("CUDA kernel events in the profiler trace", "no CUDA GPU; its CPU ops were checked")
    check("dali", dali_version())
    nsys = find_nsys()
    facts["nsys"] = {"path": nsys}
    if nsys and not importers(nsys):
        facts["nsys"].update(report=False, why=NO_IMPORTER, seconds=0.0)
    elif nsys and cuda:
        work_dir = work_dir or tempfile.mkdtemp(prefix="preflight-")
        start = time.perf_counter()
        usable, why = probe_nsys(work_dir, nsys_timeout)
        facts["nsys"].update(report=usable is not None, why=why, seconds=round(time.perf_counter() - start, 1))
    elif nsys:
        facts["skipped"]["nsys report"] = "no CUDA GPU to profile"
    done(facts, "nsys")
    return facts


def line(facts, key):
    """The line the preflight prints for the check ``key`` (None for a key without one)."""
    if key == "torch":
        return (f"torch {facts['torch']}, CUDA {facts['cuda']}, cuDNN {cudnn_text(facts['cudnn'])}, Python "
                f"{facts['python']}")
    if key == "gpu_memory_total_gb":
        return f"GPU: {facts['gpu']}, {facts['gpu_memory_free_gb']} of {facts['gpu_memory_total_gb']} GB free"
    if key == "shm_free_gb":
        return (f"/dev/shm: {facts['shm_free_gb']} GB free" if facts["shm_free_gb"] is not None else
                "/dev/shm: none (the host loaders' workers fall back to the file system)")
    if key == "missing_requirements":
        return ("requirements.txt: all importable" if not facts["missing_requirements"] else
                f"requirements.txt: NOT importable: {', '.join(facts['missing_requirements'])} -- train.py and "
                "every stage need them: carry their wheels (benchmarks/suite/gpu_suite.sh --plan)")
    if key == "compile_problem":
        return ("torch.compile: " + ("can build (C compiler and Python.h found)" if not facts["compile_problem"]
                                     else "NO: " + facts["compile_problem"]))
    if key == "conv3d_bf16":
        conv = facts["conv3d_bf16"]
        return (f"bf16 Conv3d forward+backward (8 x 64 x 32^3 -> 128): {'ok' if conv['ok'] else 'NOT FINITE'}, "
                f"{conv['ms']} ms")
    if key == "conv3d":
        found = facts["conv3d"]
        parts = [f"{precision} on {'/'.join(found[precision]['backends'])}"
                 + ("" if found[precision]["on_cudnn"] is not False else " -- OFF cuDNN: several times slower")
                 for precision in AMP_DTYPES]
        return ("3-D convolutions (conv/transposed): " + "; ".join(parts) + f"; float32 runs as "
                f"{found['tf32_runs_as']}")
    if key == "profiler":
        profiler = facts["profiler"]
        return (f"torch profiler, two steps: {profiler['kernels']} CUDA kernel events, {profiler['cpu_ops']} CPU ops"
                + ("" if profiler["ok"] else " -- the profiler saw no kernels: the profiles stage will show no "
                   "device time" if facts["gpu"] else " -- the profiler recorded nothing"))
    if key == "dali":
        return (f"DALI: {facts['dali']}" if facts["dali"] else
                "DALI: not importable (the DALI rung and tests run in the command that installs it: "
                "benchmarks/suite/gpu_suite.sh --plan)")
    if key == "nsys":
        nsys = facts["nsys"]
        if not nsys["path"]:
            return "nsys: not found (the profiles stage runs without Nsight Systems)"
        if "report" in nsys:
            return (f"nsys: {nsys['path']}, " + ("writes reports" if nsys["report"] else f"no report: {nsys['why']}")
                    + f" ({nsys['seconds']} s)")
        return f"nsys: {nsys['path']} (its report was not tried)"
    return None


CHECKS = ("torch", "gpu_memory_total_gb", "shm_free_gb", "missing_requirements", "compile_problem", "conv3d_bf16",
          "conv3d", "profiler", "dali", "nsys")


def lines(facts):
    """The checks as the lines the preflight prints."""
    out = [line(facts, key) for key in CHECKS if key in facts]
    return out + [f"skipped: {what} ({why})" for what, why in facts["skipped"].items()] + decisions(facts)


def decisions(facts):
    """What the later stages of benchmarks/suite/gpu_suite.sh do, given these facts."""
    compiles = facts["compile_problem"] is None
    nsys = facts["nsys"].get("report")
    slow = [precision for precision, found in facts.get("conv3d", {}).items()
            if isinstance(found, dict) and found["on_cudnn"] is False]
    return [f"so: tests-compile {'runs' if compiles else 'is skipped'}; the ladder's compile rung "
            f"{'runs' if compiles else 'is skipped, with the reason'}; profiles "
            f"{'with' if nsys else 'without'} Nsight Systems"
            + ("" if nsys is not None else " (its report was not tried here)")
            + f"; the DALI rung and tests {'run' if facts['dali'] else 'run only in the command that installs DALI'}"
            + (f"; the {'/'.join(slow)} rungs get one short trial each, marked slow in the table" if slow else "")
            + ("" if facts.get("conv3d", {}).get("tf32_runs_as") != "fp32" else
               "; fp32 rungs' MFU is against the FP32 peak (TF32 is off for 3-D convolutions here)")
            + ("" if facts["profiler"]["ok"] else "; the profiles will show no device time")]


def passed(facts):
    """Whether every check that ran works: the optional pieces (nsys, DALI, a compiler) do not count."""
    conv = facts.get("conv3d_bf16", {"ok": True})
    return conv["ok"] and facts["profiler"]["ok"] and not facts["missing_requirements"]


FILE = "preflight.json"  # in the output folder


def write(path, facts):
    """``facts`` to ``path`` whole, or not at all (a new file moved over the old)."""
    with open(path + ".tmp", "w") as f:
        json.dump(facts, f, indent=2)
    os.replace(path + ".tmp", path)


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_options(parser, None, "preflight", "the folder preflight.json goes in, rewritten by every "
                       "preflight (default: runs/benchmarks/preflight/, not tracked by git)")
    parser.add_argument("--nsys_timeout", type=int, default=45,
                        help="seconds for nsys to write a report, its importer included")
    args = parser.parse_args(argv)
    folder = results_folder(args, None, "preflight")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"--out_dir={relative(folder)} is a file, not a folder: the preflight writes {FILE} into "
                        "a folder. Pass --out_dir=<a folder> (a new one, or the suite's results folder).")
    out = os.path.join(folder, FILE)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    start = time.perf_counter()
    printed = set()

    def done(facts, key):  # each check written and printed as it finishes: a preflight cut short keeps them
        write(out, facts)
        text = line(facts, key)
        if text:
            print("preflight:", text, flush=True)
        for what, why in facts["skipped"].items():
            if what not in printed:
                printed.add(what)
                print(f"preflight: skipped: {what} ({why})", flush=True)

    facts = run_checks(args.nsys_timeout, done=done)
    facts["seconds"] = round(time.perf_counter() - start, 1)
    facts["passed"] = passed(facts)
    for text in decisions(facts):
        print("preflight:", text, flush=True)
    write(out, facts)
    print(f"preflight: {'passed' if facts['passed'] else 'FAILED'} in {facts['seconds']} s; results: {relative(out)}")
    return 0 if facts["passed"] else 1


def read(path=None):
    """The preflight's facts on this machine (in ``path``, by default where ``python -m benchmarks.suite.preflight``
    writes them), or None when it has not run here."""
    path = path or os.path.join(user_folder("preflight"), FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
