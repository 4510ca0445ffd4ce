"""Nsight Systems where no full installation is at hand: Debian's CLI, raw captures made reports, reports read.

    python -m benchmarks.nsight install                  # Debian's Nsight Systems 2022.4, unpacked; prints its nsys
    python -m benchmarks.nsight fetch --dir D nsight-systems-target   # only the CLI's .deb, into D
    python -m benchmarks.nsight import baseline.qdstrm   # a raw capture -> baseline.nsys-rep, beside it
    python -m benchmarks.nsight summary baseline.nsys-rep  # its kernels, NVTX ranges and OS calls, as tables

``install`` needs neither root nor a GPU: it downloads Debian's ``nsight-systems-target`` (the CLI,
``nsys``), ``nsight-systems`` (the host side: ``QdstrmImporter``, the report scripts) and ``libssh-4``
(which the importer links) from Debian 12's ``contrib non-free`` components, with an apt configuration
of its own, and unpacks them under ``~/.cache/nsight-systems-2022.4`` (``--dir``; about 600 MB). That
is the generation of Nsight Systems the original tutorial profiled with in 2022; its CUPTI goes up to
CUDA 11.8.

A machine whose ``nsys`` is the target half alone writes a raw ``.qdstrm`` capture and no report.
``import`` turns such a capture into the ``.nsys-rep`` report with the host half's ``QdstrmImporter``;
it must be the version that made the capture.

``summary`` exports a report to SQLite in a scratch folder (nothing is written beside the report)
and reads ``nsys stats``' tables: the CUDA kernels by time, the NVTX ranges, the OS runtime calls.
The tables' names changed in Nsight Systems 2023 (``gpukernsum`` became ``cuda_gpu_kern_sum``): both
are understood.

A report keeps the environment of every process nsys sees. A profiled run goes in a PID namespace of
its own (:func:`own_processes`) and in :func:`profile_environment`: what the run needs (paths,
CUDA's, NCCL's and the threads' settings), none of the rest.
"""
import argparse
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from utils.errors import UserError, exit_on_user_error

VERSION = "2022.4"
PACKAGES = ("nsight-systems-target", "nsight-systems", "libssh-4")
DEFAULT_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                           f"nsight-systems-{VERSION}")
# Debian 12's components that hold the three packages (libssh-4 is in main).
DEBIAN_SOURCE = """Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# Where the packages put the CLI and the host half, under the unpacked root.
TARGET = "usr/lib/nsight-systems/target-linux-x64"
HOST = "usr/lib/nsight-systems/host-linux-x64"

# The tables summary() reads: (the name since 2023, the name before), and how many rows it keeps.
TABLES = {"kernels": (("cuda_gpu_kern_sum", "gpukernsum"), 12),
          "nvtx": (("nvtx_sum", "nvtxsum"), 20),
          "osrt": (("osrt_sum", "osrtsum"), 8)}

# What a profiled run keeps of the environment: these names, every variable with one of these prefixes,
# and of PATH the system's folders, NVIDIA's and the running Python's.
KEPT_NAMES = ("HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV",
              "RANK", "WORLD_SIZE", "ENABLE_PROFILING", "PROFILE_OUTPUT")
KEPT_PREFIXES = ("CUDA_", "NCCL_", "OMP_", "MKL_", "TORCH_", "PYTORCH_", "NVIDIA_", "CUDNN_", "SLURM_",
                 "MASTER_", "LOCAL_")
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def profile_environment(environ=None):
    """The environment to run a profiled command in. A report keeps the environment of each process
    it records: it should hold what the run needs, not the rest of the machine's settings."""
    environ = os.environ if environ is None else environ
    kept = {key: value for key, value in environ.items() if key in KEPT_NAMES or key.startswith(KEPT_PREFIXES)}
    folders = [folder for folder in environ.get("PATH", "").split(os.pathsep)
               if folder in SYSTEM_PATH or folder == os.path.dirname(sys.executable)
               or any(word in folder.lower() for word in ("cuda", "nvidia", "nsight"))]
    kept["PATH"] = os.pathsep.join(dict.fromkeys(folders)) or os.pathsep.join(SYSTEM_PATH)
    return kept


# nsys records every process it can see, each with its environment: a run in a PID namespace of its own
# (root, or user namespaces) shows it its own processes alone. --kill-child: a limit that ends unshare
# ends what runs inside too. Inside, nsys's session state (in /dev/shm and /tmp/nvidia, keyed by process
# ids, which every namespace numbers from 1 again) is the run's own too: the state of a session killed
# earlier, at the same ids, would stop it with "Agent launcher failed".
PRIVATE_STATE = ('mount -t tmpfs tmpfs /dev/shm && mkdir -p /tmp/nvidia && mount -t tmpfs tmpfs /tmp/nvidia '
                 '&& exec "$@"')
SCOPES = (["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", PRIVATE_STATE, "scope"],
          ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c",
           PRIVATE_STATE, "scope"])


def own_processes():
    """The prefix that runs a command in a PID namespace of its own, where this machine allows one;
    else ``[]`` (the report then lists the machine's other processes too)."""
    if not shutil.which("unshare"):
        return []
    for prefix in SCOPES:
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0:
                return list(prefix)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return []


# ----------------------------------------------------------------------------- installing

def unpacked_nsys(folder=DEFAULT_DIR):
    """The nsys of an unpacked installation in ``folder``; None where there is none."""
    path = os.path.join(folder, "root", TARGET, "nsys")
    return path if os.access(path, os.X_OK) else None


def fetch(folder, packages=PACKAGES):
    """Download Debian's ``packages`` (.deb files) into ``folder`` with an apt configuration of its own
    (no root, the machine's sources untouched); returns their paths."""
    if not shutil.which("apt-get"):
        raise UserError("Downloading Nsight Systems from Debian needs apt-get, and this machine has none. "
                        "Install Nsight Systems from NVIDIA (https://developer.nvidia.com/nsight-systems) "
                        "or use a cluster's (module load nsight-systems).")
    apt = os.path.join(folder, "apt")
    for sub in ("sources", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(apt, sub), exist_ok=True)
    with open(os.path.join(apt, "sources", "debian.sources"), "w") as f:
        f.write(DEBIAN_SOURCE)
    open(os.path.join(apt, "status"), "w").close()
    options = ["-o", "Dir::Etc::sourcelist=/dev/null", "-o", f"Dir::Etc::sourceparts={apt}/sources",
               "-o", f"Dir::State::lists={apt}/lists", "-o", f"Dir::State::status={apt}/status",
               "-o", f"Dir::Cache={apt}/cache"]  # an empty status: the machine's own packages play no part
    if os.geteuid() == 0:  # root's apt downloads as _apt, which may not write here
        options += ["-o", "APT::Sandbox::User=root"]
    for action in (["update", "-qq"], ["download", *packages]):
        result = subprocess.run(["apt-get", *options, *action], cwd=folder, capture_output=True, text=True,
                                timeout=900)
        if result.returncode != 0:
            raise UserError(f"Downloading Nsight Systems from Debian failed: `apt-get {' '.join(action)}` "
                            f"ended with exit status {result.returncode}: {result.stderr.strip()[-600:]} "
                            "Check that deb.debian.org can be reached, or install Nsight Systems from NVIDIA.")
    debs = [next(iter(glob.glob(os.path.join(folder, f"{package}_*.deb"))), None) for package in packages]
    missing = [package for package, deb in zip(packages, debs) if deb is None]
    if missing:
        raise UserError(f"apt-get download left no .deb for {', '.join(missing)} in {folder}.")
    return debs


def unpack(folder, debs):
    """Unpack the packages under ``folder``/root, as dpkg would install them; returns the nsys path. They
    are unpacked beside it first: an interrupted unpacking leaves no half installation to be found."""
    partial = os.path.join(folder, "root.partial")
    shutil.rmtree(partial, ignore_errors=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", deb, partial], check=True, timeout=600)
    if not os.access(os.path.join(partial, TARGET, "nsys"), os.X_OK):
        raise UserError(f"The packages unpacked under {partial} hold no {TARGET}/nsys.")
    # The CLI finds its importer in the host folder beside its own real folder (the multiarch path).
    target = os.path.realpath(os.path.join(partial, TARGET))
    beside = os.path.join(os.path.dirname(target), "host-linux-x64")
    if not os.path.exists(beside):
        os.symlink(os.path.relpath(os.path.join(partial, HOST), os.path.dirname(target)), beside)
    os.rename(partial, os.path.join(folder, "root"))
    return unpacked_nsys(folder)


def install(folder=DEFAULT_DIR):
    """Debian's Nsight Systems 2022.4 in ``folder`` (downloaded and unpacked once); returns its nsys."""
    nsys = unpacked_nsys(folder)
    if nsys:
        return nsys
    os.makedirs(folder, exist_ok=True)
    debs = fetch(folder)
    nsys = unpack(folder, debs)
    remove = debs + [os.path.join(folder, "apt")]  # 170 MB of packages and apt's lists, no longer needed
    for path in remove:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return nsys


def find_nsys():
    """An nsys executable: on PATH, inside an NVIDIA installation (Nsight Systems, Nsight Compute or CUDA),
    or the one ``install`` unpacked."""
    found = shutil.which("nsys")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-systems*/*/bin/nsys", "/opt/nvidia/nsight-compute/*/host/*/nsys",
                    "/usr/local/cuda*/bin/nsys", "/usr/local/cuda*/nsight-systems*/bin/nsys"):
        candidates = sorted(glob.glob(pattern))
        if candidates:
            return candidates[-1]
    return unpacked_nsys()


def importers(nsys):
    """The QdstrmImporter executables that belong with ``nsys``: beside it, or in a sibling host folder."""
    folder = os.path.dirname(os.path.realpath(nsys))
    return sorted(set(glob.glob(os.path.join(folder, "QdstrmImporter*")) +
                      glob.glob(os.path.join(folder, "..", "*", "QdstrmImporter*"))))


# ----------------------------------------------------------------------------- reports

def import_capture(capture, importer, timeout=600):
    """Turn a raw ``.qdstrm`` capture into the ``.nsys-rep`` report beside it; returns its path."""
    report = capture[:-len(".qdstrm")] + ".nsys-rep"
    result = subprocess.run([importer, "-i", capture], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 or not os.path.exists(report):
        raise UserError(f"{importer} made no report of {capture} (exit status {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip()[-600:]} The importer must be the version "
                        "of the nsys that made the capture (`nsys --version` on that machine).")
    return report


def nsys_run(nsys, args, timeout=600, statuses=(0,)):
    """``nsys <args>``'s output. It runs in an empty folder of its own: ``nsys stats``' Python imports
    modules of the folder it runs in first (this repository's ``utils``, a stray ``hashlib.py``)."""
    with tempfile.TemporaryDirectory() as empty:
        result = subprocess.run([nsys, *args], capture_output=True, text=True, timeout=timeout, cwd=empty)
    if result.returncode not in statuses:
        raise UserError(f"`nsys {' '.join(args)}` failed (exit status {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip()[-600:]}")
    return result.stdout


def export_sqlite(nsys, report, sqlite):
    """The report's SQLite export, written to ``sqlite``."""
    nsys_run(nsys, ["export", "--type", "sqlite", "--force-overwrite", "true", "--output", os.path.abspath(sqlite),
                    os.path.abspath(report)])
    return sqlite


def report_names(nsys):
    """The names of the reports this nsys's ``stats`` has."""
    text = nsys_run(nsys, ["stats", "--help-reports"], statuses=(0, 1))  # 2022.4 ends its help with status 1
    return {line.split()[0].split("[")[0] for line in text.splitlines() if " -- " in line}


def read_table(path):
    """A stats CSV as rows: name, share of the table's time, total ms, count (and the range's style)."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            count = row.get("Instances") or row.get("Num Calls") or row.get("Count") or 0
            name = row.get("Name") or row.get("Range") or ""
            rows.append({"name": name.lstrip(":"), "share": float(row["Time (%)"]) / 100,
                         "ms": int(float(row["Total Time (ns)"])) / 1e6, "count": int(float(count)),
                         **({"style": row["Style"]} if row.get("Style") else {})})
    return rows


def summary(nsys, report, sqlite=None):
    """``{kernels, nvtx, osrt}``: the report's tables as :func:`read_table` rows (a table the report holds
    no data for is empty), and ``nsys``: the version that read it. Scratch files only: nothing is written
    beside the report unless ``sqlite`` names where its export goes."""
    report, names = os.path.abspath(report), report_names(nsys)
    version = nsys_run(nsys, ["--version"]).strip()
    with tempfile.TemporaryDirectory() as scratch:
        sqlite = export_sqlite(nsys, report, sqlite or os.path.join(scratch, "report.sqlite"))
        tables = {"nsys": version}
        for key, (choices, keep) in TABLES.items():
            name = next(choice for choice in choices if choice in names)
            base = os.path.join(scratch, key)
            nsys_run(nsys, ["stats", "--report", name, "--format", "csv", "--output", base, sqlite])
            made = glob.glob(base + "_*.csv")  # none where the report holds no such data ("SKIPPED")
            tables[key] = read_table(made[0])[:keep] if made else []
    return tables


def summary_text(tables):
    """The tables of :func:`summary` in Markdown."""
    lines = [f"Read with {tables['nsys']}."]
    headings = {"kernels": "CUDA kernels by time", "nvtx": "NVTX ranges", "osrt": "OS runtime calls by time"}
    for key, heading in headings.items():
        rows = tables[key]
        if not rows:
            lines += ["", f"{heading}: none in this report."]
            continue
        lines += ["", f"{heading}:", "", "| name | share | total ms | count |", "|---|---|---|---|"]
        lines += [f"| `{row['name'][:100]}` | {row['share']:.1%} | {row['ms']:.2f} | {row['count']} |" for row in rows]
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("install", help="download and unpack Debian's Nsight Systems 2022.4; prints its nsys")
    setup.add_argument("--dir", default=DEFAULT_DIR, help=f"where (default: {DEFAULT_DIR})")
    download = commands.add_parser("fetch", help="only download Debian's packages (.deb files) into --dir")
    download.add_argument("--dir", required=True)
    download.add_argument("packages", nargs="*", default=list(PACKAGES), help=f"default: {' '.join(PACKAGES)}")
    capture = commands.add_parser("import", help="turn a .qdstrm capture into a .nsys-rep report beside it")
    capture.add_argument("capture")
    capture.add_argument("--nsys", default=None, help="the nsys whose QdstrmImporter to use (default: "
                         "the one found, or the one install unpacked)")
    read = commands.add_parser("summary", help="a report's kernels, NVTX ranges and OS runtime calls")
    read.add_argument("report")
    read.add_argument("--nsys", default=None)
    args = parser.parse_args(argv)

    if args.command == "install":
        print(install(args.dir))
        return
    if args.command == "fetch":
        os.makedirs(args.dir, exist_ok=True)
        print("\n".join(fetch(args.dir, args.packages)))
        return
    nsys = args.nsys or find_nsys()
    if nsys is None:
        raise UserError("No nsys found (PATH, /opt/nvidia, /usr/local/cuda, or "
                        f"{DEFAULT_DIR}). Run `python -m benchmarks.nsight install` first.")
    path = args.capture if args.command == "import" else args.report
    if not os.path.exists(path):
        raise UserError(f"{path} does not exist.")
    if args.command == "import":
        found = importers(nsys)
        if not found:
            raise UserError(f"No QdstrmImporter beside {nsys}: it is the target half of Nsight Systems alone. "
                            "Run `python -m benchmarks.nsight install` and pass --nsys=<the nsys it prints>.")
        print(import_capture(os.path.abspath(path), found[0]))
    else:
        print(summary_text(summary(nsys, path)))


if __name__ == "__main__":
    sys.exit(main())
