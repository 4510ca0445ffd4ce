"""Every command of `benchmarks/suite/gpu_suite.sh --plan` runs on a bare machine.

The commands run here, in the plan's order, as a remote GPU machine would run them: each in a fresh
copy of the working tree (tracked and untracked-not-ignored files, and only the ignored folders the
command carries), a fresh empty HOME (where it installs what it carries) and a fresh $OUT, with
ruamel.yaml hidden from Python as the GPU machine lacks it, and ``python3`` this machine's Python.
CPU_CHECK=1 makes every stage run its set-up and its tools at tiny sizes on the CPU presets, the
GPU-only steps skipped by their own checks. Nothing is kept between commands but what the plan
says travels: the carried folders (.carry/wheels, the preflight's answer that the plan copies into
.carry/preflight after the first command, DALI's parts). The one thing that stays on the machine
is DALI's parts, gathered over the commands of DALI's session: those share one HOME, and the last
one's install is also run alone, on a bare machine, where it must say that DALI is missing and go on.

DALI's parts here are packed by benchmarks/suite/pack_dali.sh from a small real wheel of one of the
packages DALI imports (the transport: the unzipped site folder, the xz tar, its parts, the sha256,
the extraction), not DALI's 254 MB of wheels; this machine's DALI (CPU mode) is what then imports.
"""
import hashlib
import io
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from benchmarks.suite import plan as suite_plan
from conftest import ROOT, timeout_for

PACK = os.path.join(ROOT, "benchmarks", "suite", "pack_dali.sh")

pytestmark = pytest.mark.slow

SITE_PACKAGES = str(importlib.metadata.distribution("ruamel.yaml").locate_file(""))
# What the GPU machine lacks among what the stages import: hidden from this Python but where installed.
HIDE = f'''
import importlib.machinery, sys
class _Lacking:
    """The GPU machine has no ruamel.yaml: found only outside {SITE_PACKAGES!r} (where a command installs it)."""
    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in ("ruamel", "_ruamel_yaml"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if not p.startswith({SITE_PACKAGES!r})])
        if spec is None:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return spec
sys.meta_path.insert(0, _Lacking())
'''


def plan_output(*args):
    result = subprocess.run([os.path.join(ROOT, "benchmarks", "suite", "gpu_suite.sh"), "--plan", *args], cwd=ROOT,
                            env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def plan():
    """The single-GPU plan's output, made once for the module."""
    return plan_output()


def plan_commands(output):
    """(what, command, carry) of each command the plan prints."""
    return [(what, command, carry.split(", "))
            for what, carry, command in re.findall(r"^ *\d+\. (.+?): budget \d+ s, about \d+ s; carry (.+?); "
                                                    r"timeout_s \d+ \(fits\)\n    \$ (.+)$", output, flags=re.M)]


def carry_preflight_answer(output, carried, files):
    """The plan's step after the preflight's command, as printed: its preflight.json copied out of the command's
    archive into the checkout's .carry/preflight, which the commands after it carry."""
    [copy] = re.findall(r"^After command \d+ \(the preflight\), within the 30 s: (.+?) \(the preflight's", output,
                        flags=re.M)
    copy = copy.replace("<its files>", os.path.dirname(files["gpu_suite_preflight.tgz"]))
    subprocess.run(["bash", "-c", copy], cwd=carried, check=True, timeout=timeout_for(60))


def wheel_of(distribution, folder):
    """A wheel of an installed pure-Python distribution, made from its installed files."""
    dist = importlib.metadata.distribution(distribution)
    path = folder / f"{dist.metadata['Name'].replace('.', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for file in dist.files:
            if "__pycache__" not in str(file) and dist.locate_file(file).is_file():
                wheel.write(dist.locate_file(file), str(file))
    return path


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """What travels: a checkout's carried folders (small wheels, DALI's parts), and a way to run a command
    of the plan in a fresh tree."""
    base = tmp_path_factory.mktemp("bare")
    carried = base / "checkout"  # the ignored folders of the developer's checkout
    (carried / ".carry" / "wheels").mkdir(parents=True)
    wheel_of("ruamel.yaml", carried / ".carry" / "wheels")
    # DALI's parts as benchmarks/suite/pack_dali.sh packs them, from a wheel of makefun (which DALI imports).
    dali_wheels = base / "dali"
    dali_wheels.mkdir()
    wheel_of("makefun", dali_wheels)
    subprocess.run([PACK, "--wheels", str(dali_wheels), "--parts", str(suite_plan.DALI_PARTS)], cwd=carried,
                   check=True, capture_output=True, timeout=timeout_for(120))
    assert sorted(path.name for path in (carried / ".carry").iterdir()) == sorted(
        ["wheels"] + [str(k) for k in range(1, suite_plan.DALI_PARTS + 1)])
    bin_dir, hide_dir = base / "bin", base / "hide"
    bin_dir.mkdir()
    hide_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # a link would lose the venv
    (bin_dir / "python3").chmod(0o755)
    (hide_dir / "sitecustomize.py").write_text(HIDE)
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split("\0")
    runs = []

    def run(command, carry, home=None):
        """Run ``command`` in a fresh tree with ``carry`` copied in; (status, output, files under $OUT)."""
        number = len(runs) + 1
        tree, out = base / f"tree{number}", base / f"out{number}"
        home = home or base / f"home{number}"
        out.mkdir()
        home.mkdir(exist_ok=True)
        for name in filter(None, tracked):
            if os.path.isfile(os.path.join(ROOT, name)):
                os.makedirs(tree / os.path.dirname(name), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, name), tree / name)
        for folder in carry:
            if (carried / folder).exists():
                shutil.copytree(carried / folder, tree / folder)
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "OUT": str(out), "CPU_CHECK": "1",
               "COMMIT": "test", "PYTHONPATH": str(hide_dir), "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": ""}
        result = subprocess.run(["bash", "-c", command], cwd=tree, env=env, capture_output=True, text=True,
                                timeout=timeout_for(900))
        runs.append(number)
        return result.returncode, result.stdout + result.stderr, {path.name: path for path in out.iterdir()}

    return carried, run


def archive_text(path):
    with tarfile.open(path) as archive:
        return {os.path.basename(name): archive.extractfile(name).read().decode(errors="replace")
                for name in archive.getnames()}


def check_headline(texts, log):
    """The headline's CPU check: every step ran at the CPU preset's tiny sizes (the original's --help: its
    train.py needs CUDA; ncu's command printed and the layers run without it), each step's outcome in
    summary.txt, and the results of each in the archive."""
    summary = texts["summary.txt"]
    for name in ("layers", "compile-auto", "compile-off", "original", "ncu", "anchor"):
        assert f"step {name}: status 0 in " in summary, summary
    for rung in ("compile-auto", "compile-off", "anchor"):
        result = json.loads(texts[f"{rung}.json"])
        assert result["full"] > 0 and result["synthetic"] > 0 and result["io"] > 0, rung
    assert "Exact forms: " in log and "--exact_forms=auto" in log  # the measured rung's own log, in the stage's
    [layers] = [json.loads(text) for name, text in texts.items() if name.startswith("cpu-") and name.endswith(".json")]
    assert layers["exact_forms"] == "[]" and set(layers["in_step"]) == {"off", "auto", "on"}  # auto on a CPU: plain
    assert "ncu_layers: would run: ncu --clock-control none --profile-from-start off --nvtx" in log
    assert "ncu_layers: last sub-pixel: " in log and "--original ORIGINAL" in log


def test_every_command_of_the_plan_runs_on_a_bare_machine(machine, plan):
    carried, run = machine
    commands = plan_commands(plan)
    assert [what for what, _, _ in commands][:4] == ["stage headline", "stage preflight",
                                                     "stage tests-gpu and tests-compile", "stage tests-distributed"]
    dali_home = None
    gathered = 0
    for number, (what, command, carry) in enumerate(commands, start=1):
        gathers = what.startswith("DALI")
        if gathers and dali_home is None:
            dali_home = carried.parent / "dali-home"  # the parts gather on one machine: the plan's one exception
        status, output, files = run(command, carry, home=dali_home if gathers else None)
        assert status == 0, f"command {number} ({what}) failed:\n{output[-4000:]}"
        if gathers:  # this command's part, beside the earlier ones
            gathered += 1
            assert sorted(path.name for path in (dali_home / "carry").glob("site.tar.xz.?")) == [
                f"site.tar.xz.{k}" for k in range(gathered)]
        stages = re.search(r"gpu_suite\.sh (.+)$", command)
        for stage in stages.group(1).split() if stages else []:
            texts = archive_text(files[f"gpu_suite_{stage}.tgz"])
            [log] = [text for name, text in texts.items() if name.startswith(f"gpu_suite-{stage}-")]
            assert f"stage {stage} ended with status 0" in log and "CPU_CHECK=1" in log, log[-3000:]
            if stage == "preflight":
                facts = json.loads(texts["preflight.json"])
                assert facts["passed"] and facts["missing_requirements"] == []  # ruamel.yaml came from the carry
                with tarfile.open(files["gpu_suite_preflight.tgz"]) as archive:  # outside the tracked folders
                    assert all(name.startswith(suite_plan.SUITE_RESULTS + "/") for name in archive.getnames())
                carry_preflight_answer(plan, carried, files)
                assert json.loads((carried / ".carry" / "preflight" / "preflight.json").read_text()) == facts
            if stage in ("ladder", "dali"):
                [report] = [json.loads(text) for name, text in texts.items()
                            if name.endswith(".json") and name.startswith("cpu-")]
                assert report["runs"] and all("error" not in entry and entry["full"] > 0 for entry in report["runs"])
            if stage == "headline":
                check_headline(texts, log)
            if stage == "profiles":
                assert "profiles.json" in texts and "profiles without nsys" in log  # the carried answer: none here
            if stage.startswith("tests") or stage == "dali":
                assert re.search(r"\d+ skipped", log) and " failed" not in log  # the GPU tests' own checks
        if what.endswith("the dali stage"):  # the packed site, extracted where PYTHONPATH points
            assert "DALI not installed" not in output and (dali_home / "site" / "makefun" / "__init__.py").is_file()
    assert gathered == suite_plan.DALI_PARTS


def test_without_the_install_a_later_command_fails_at_its_imports(machine, plan):
    """The harness is honest: a command that relies on what an earlier command installed (the old plan
    installed ruamel.yaml in its first command only) fails on a bare machine."""
    _, run = machine
    [(_, command, carry)] = [entry for entry in plan_commands(plan) if entry[0] == "stage ladder"]
    assert command.startswith(suite_plan.INSTALL + " && ")
    status, output, files = run(command[len(suite_plan.INSTALL + " && "):], carry)
    # utils/env_check.py names what is missing before anything imports it
    assert status != 0 and "error: ruamel.yaml is not installed in this Python" in output


def test_the_last_dali_command_on_a_new_machine_says_what_is_missing_and_goes_on(machine, plan):
    _, run = machine
    [(_, command, carry)] = [entry for entry in plan_commands(plan) if entry[0].endswith("the dali stage")]
    status, output, _ = run(command.replace("benchmarks/suite/gpu_suite.sh dali", "echo dali stage runs"), carry)
    assert status == 0 and "DALI not installed: a part is missing" in output and "dali stage runs" in output


def test_the_last_dali_command_refuses_a_broken_part(machine, plan):
    """A part changed on the way fails the sha256 check: nothing is extracted, the dali stage still runs."""
    carried, run = machine
    [(_, command, carry)] = [entry for entry in plan_commands(plan) if entry[0].endswith("the dali stage")]
    home = carried.parent / "broken-home"
    (home / "carry").mkdir(parents=True)
    for k in range(1, suite_plan.DALI_PARTS):
        part = bytearray((carried / ".carry" / str(k) / f"site.tar.xz.{k - 1}").read_bytes())
        if k == 1:
            part[len(part) // 2] ^= 1
        (home / "carry" / f"site.tar.xz.{k - 1}").write_bytes(part)
    status, output, _ = run(command.replace("benchmarks/suite/gpu_suite.sh dali", "echo dali stage runs"), carry, home=home)
    assert status == 0 and "site.tar.xz: FAILED" in output and "DALI not installed" in output
    assert "dali stage runs" in output and not (home / "site" / "makefun").exists()


def test_the_packer_keeps_one_python_and_its_parts_rejoin_into_the_checked_tar(tmp_path):
    """benchmarks/suite/pack_dali.sh on local wheels: one site folder of all of them, DALI's backends for other
    Pythons than the GPU machine's 3.12 left out, the xz tar cut into parts, its sha256 in the last part's folder."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "nvidia_dali_stand_in-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("nvidia/dali/__init__.py", "")
        for tag in ("310", "312", "313"):
            wheel.writestr(f"nvidia/dali/backend_impl.cpython-{tag}-x86_64-linux-gnu.so", tag)
    wheel_of("makefun", wheels)
    result = subprocess.run([PACK, "--wheels", str(wheels), "--parts", str(suite_plan.DALI_PARTS)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=timeout_for(120))
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    assert "2 wheels" in result.stdout and f"in {suite_plan.DALI_PARTS} parts" in result.stdout
    assert sorted(path.name for path in (tmp_path / ".carry").iterdir()) == [
        str(k) for k in range(1, suite_plan.DALI_PARTS + 1)]  # its work folder removed
    parts = [tmp_path / ".carry" / str(k) / f"site.tar.xz.{k - 1}" for k in range(1, suite_plan.DALI_PARTS + 1)]
    joined = b"".join(part.read_bytes() for part in parts)
    last = tmp_path / ".carry" / str(suite_plan.DALI_PARTS)
    assert sorted(path.name for path in last.iterdir()) == ["site.sha256", parts[-1].name]
    assert (last / "site.sha256").read_text() == f"{hashlib.sha256(joined).hexdigest()}  site.tar.xz\n"
    with tarfile.open(fileobj=io.BytesIO(joined), mode="r:xz") as archive:
        names = set(archive.getnames())
    assert {"./nvidia/dali/__init__.py", "./nvidia/dali/backend_impl.cpython-312-x86_64-linux-gnu.so",
            "./makefun/__init__.py"} <= names
    assert not [name for name in names if "backend_impl.cpython-31" in name and "-312-" not in name]
    # A count other than the plan's is pointed out.
    result = subprocess.run([PACK, "--wheels", str(wheels), "--parts", "2"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=timeout_for(120))
    assert result.returncode == 0 and f"carries DALI_PARTS = {suite_plan.DALI_PARTS} parts, not 2" in result.stderr
    assert sorted(path.name for path in (tmp_path / ".carry").iterdir()) == ["1", "2"]


def test_the_multi_gpu_plans_own_stage_runs_on_a_bare_machine(machine, plan):
    """The multi-GPU plan's commands are the preflight, which the single-GPU plan's test runs, the scaling stage,
    likewise, and its own stage: multi-gpu runs here on a bare machine, where its two-rank runs are skipped
    (no two GPUs)."""
    _, run = machine
    commands = re.findall(r"^ *\d+\. (.+?): budget \d+ s, about \d+ s; carry (.+?); timeout_s \d+ \(fits\)\n    \$ (.+)$",
                          plan_output("--gpus", "4"), flags=re.M)
    assert [what for what, _, _ in commands] == ["stage preflight", "stage multi-gpu", "stage scaling"]
    single = plan_commands(plan)
    for what, carry, command in commands:
        if what != "stage multi-gpu":  # the single-GPU plan's command, which its test runs
            assert (what, command, carry.split(", ")) in single, what
    [(what, carry, command)] = [entry for entry in commands if entry[0] == "stage multi-gpu"]
    status, output, files = run(command, carry.split(", "))
    assert status == 0, f"{what} failed:\n{output[-4000:]}"
    [log] = [text for name, text in archive_text(files["gpu_suite_multi-gpu.tgz"]).items()
             if name.startswith("gpu_suite-multi-gpu-")]
    assert "stage multi-gpu ended with status 0" in log
    assert "not run: they need 2 CUDA GPUs over NCCL, and this machine has 0" in log
