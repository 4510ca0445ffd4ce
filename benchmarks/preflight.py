"""The GPU suite's first command: in about 30 seconds, what every later stage relies on.

    python -m benchmarks.preflight                 # = benchmarks/gpu_suite.sh preflight

It prints one line per check and writes them to ``benchmarks/results/preflight.json``, which the
later stages of ``benchmarks/gpu_suite.sh`` read to decide what they run:

- torch, CUDA and cuDNN versions, the GPU's name and free memory;
- the runtime requirements (requirements.txt) importable, which train.py needs;
- free space in ``/dev/shm`` (the host loaders' workers pass their batches through it);
- a C compiler and ``Python.h``, which torch.compile needs (Triton and Inductor build small C
  wrappers): without them the compile rungs and tests are skipped with a line that says why;
- a bf16 3-D convolution, forward and backward, on the GPU, with its time;
- a two-step torch-profiler trace that must hold CUDA kernel events (CUPTI records none on some
  sandboxed machines: then the profiles stage would show no device time);
- ``nsys``: found or not, and whether it writes a report of a short CUDA program within
  ``--nsys_timeout`` seconds (its process group is ended at the limit);
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

from benchmarks.common import ROOT
from utils.compiler import compile_problem
from utils.conv3d import cudnn_text
from utils.data_loader import shm_free_bytes

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


def run_checks(nsys_timeout=60, work_dir=None):
    """Every check this machine can run, as a dict; ``skipped`` names the rest, with the reason."""
    from benchmarks.profiles import find_nsys, probe_nsys

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if cuda else None, "python": sys.version.split()[0],
             "gpu": torch.cuda.get_device_name(0) if cuda else None, "skipped": {}}
    if cuda:
        free, total = torch.cuda.mem_get_info(0)
        facts["gpu_memory_free_gb"], facts["gpu_memory_total_gb"] = round(free / 1e9, 1), round(total / 1e9, 1)
    else:
        facts["skipped"]["GPU name and free memory"] = "no CUDA GPU"
    shm = shm_free_bytes()
    facts["shm_free_gb"] = None if shm is None else round(shm / 1e9, 2)
    facts["missing_requirements"] = missing_requirements()
    facts["compile_problem"] = compile_problem()
    if cuda:
        facts["conv3d_bf16"] = conv3d_check(device)
    else:
        facts["skipped"]["a bf16 Conv3d forward and backward on the GPU"] = "no CUDA GPU"
    facts["profiler"] = profiler_check(device)
    if not cuda:
        facts["skipped"]["CUDA kernel events in the profiler trace"] = "no CUDA GPU; its CPU ops were checked"
    nsys = find_nsys()
    facts["nsys"] = {"path": nsys}
    if nsys and cuda:
        work_dir = work_dir or tempfile.mkdtemp(prefix="preflight-")
        start = time.perf_counter()
        usable, why = probe_nsys(work_dir, nsys_timeout)
        facts["nsys"].update(report=usable is not None, why=why, seconds=round(time.perf_counter() - start, 1))
    elif nsys:
        facts["skipped"]["nsys report"] = "no CUDA GPU to profile"
    facts["dali"] = dali_version()
    return facts


def lines(facts):
    """The checks as the lines the preflight prints."""
    out = [f"torch {facts['torch']}, CUDA {facts['cuda']}, cuDNN {cudnn_text(facts['cudnn'])}, Python {facts['python']}"]
    if facts["gpu"]:
        out.append(f"GPU: {facts['gpu']}, {facts['gpu_memory_free_gb']} of {facts['gpu_memory_total_gb']} GB free")
    out.append(f"/dev/shm: {facts['shm_free_gb']} GB free" if facts["shm_free_gb"] is not None else
               "/dev/shm: none (the host loaders' workers fall back to the file system)")
    out.append("requirements.txt: all importable" if not facts["missing_requirements"] else
               f"requirements.txt: NOT importable: {', '.join(facts['missing_requirements'])} -- train.py and every "
               "stage need them: carry their wheels (benchmarks/gpu_suite.sh --plan)")
    out.append(f"torch.compile: {'can build (C compiler and Python.h found)' if not facts['compile_problem'] else 'NO: ' + facts['compile_problem']}")
    if "conv3d_bf16" in facts:
        conv = facts["conv3d_bf16"]
        out.append(f"bf16 Conv3d forward+backward (8 x 64 x 32^3 -> 128): {'ok' if conv['ok'] else 'NOT FINITE'}, "
                   f"{conv['ms']} ms")
    profiler = facts["profiler"]
    out.append(f"torch profiler, two steps: {profiler['kernels']} CUDA kernel events, {profiler['cpu_ops']} CPU ops"
               + ("" if profiler["ok"] else " -- the profiler saw no kernels: the profiles stage will show no "
                  "device time" if facts["gpu"] else " -- the profiler recorded nothing"))
    nsys = facts["nsys"]
    if not nsys["path"]:
        out.append("nsys: not found (the profiles stage runs without Nsight Systems)")
    elif "report" in nsys:
        out.append(f"nsys: {nsys['path']}, " + ("writes reports" if nsys["report"] else f"no report: {nsys['why']}")
                   + f" ({nsys['seconds']} s)")
    else:
        out.append(f"nsys: {nsys['path']} (its report was not tried)")
    out.append(f"DALI: {facts['dali']}" if facts["dali"] else
               "DALI: not importable (install it first for the DALI rung and tests: benchmarks/gpu_suite.sh --plan)")
    for what, why in facts["skipped"].items():
        out.append(f"skipped: {what} ({why})")
    return out + decisions(facts)


def decisions(facts):
    """What the later stages of benchmarks/gpu_suite.sh do, given these facts."""
    compiles = facts["compile_problem"] is None
    nsys = facts["nsys"].get("report")
    return [f"so: tests-compile {'runs' if compiles else 'is skipped'}; the ladder's compile rung "
            f"{'runs' if compiles else 'is skipped, with the reason'}; profiles "
            f"{'with' if nsys else 'without'} Nsight Systems"
            + ("" if nsys is not None else " (its report was not tried here)")
            + f"; the DALI rung and tests {'run' if facts['dali'] else 'skip unless DALI is installed first'}"
            + ("" if facts["profiler"]["ok"] else "; the profiles will show no device time")]


def passed(facts):
    """Whether every check that ran works: the optional pieces (nsys, DALI, a compiler) do not count."""
    conv = facts.get("conv3d_bf16", {"ok": True})
    return conv["ok"] and facts["profiler"]["ok"] and not facts["missing_requirements"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "preflight.json"))
    parser.add_argument("--nsys_timeout", type=int, default=60, help="seconds for nsys to write a report")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    facts = run_checks(args.nsys_timeout)
    facts["seconds"] = round(time.perf_counter() - start, 1)
    facts["passed"] = passed(facts)
    for line in lines(facts):
        print("preflight:", line, flush=True)
    print(f"preflight: {'passed' if facts['passed'] else 'FAILED'} in {facts['seconds']} s; {args.out}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(facts, f, indent=2)
    return 0 if facts["passed"] else 1


def read(path=os.path.join(ROOT, "benchmarks", "results", "preflight.json")):
    """The preflight's facts on this machine, or None when it has not run here."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
