"""The measurement notes: one index of every committed result, with its provenance, made from the files.

    python -m benchmarks.notes            # writes benchmarks/results/README.md (make notes)
    python -m benchmarks.notes --check    # exit 1 if the committed notes differ from what the files make

The chapters quote numbers; this index says where each set of numbers came from: the tool's own
provenance line (its command, device, versions and date, as each results file opens), the device and
date, and a link. It also holds the one status table of what has run where, and what is not measured
yet. Nothing here is typed by hand but the list of what is still to measure (:data:`NOT_MEASURED`):
regenerate after committing a result, and tests/test_notes.py fails until you do.
"""
import argparse
import difflib
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTES = os.path.join("benchmarks", "results", "README.md")
SOURCES = ("benchmarks/results/**/*.md", "example_logs/**/README.md", "sample_nsys_profiles/**/README.md")
PROVENANCE = re.compile(r"^(Measured by|Measured with|Made by|Made with|Two |One )")
DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")
# Devices as the provenance lines name them, in this order (a prediction for an H100 is a computation),
# then as the tools name their result files and folders.
DEVICES = (("a computation", "none (a computation)"), ("H100", "H100"), ("H200", "H200"), ("CPU", "CPU (2 cores)"),
           ("2-core", "CPU (2 cores)"))
PATH_DEVICES = (("nvidia-h100", "H100"), ("nvidia-h200", "H200"), ("cpu-vm-2-cores", "CPU (2 cores)"))

# What the GPU work has still to measure, and the targets it is measured against (one H100 or H200,
# local batch 64, crop 64, bf16, side by side in one run). A row leaves this list when its result is committed.
NOT_MEASURED = [
    ("the best rung (torch.compile on channels_last, exact forms `auto`): FULL MFU", "at least 0.21 on an H100"),
    ("the best rung against the original's best settings on the same GPU", "at least 1.8 times"),
    ("FULL against SYNTHETIC at the best rung", "at least 0.95"),
    ("a CUDA graph against eager at the launch-bound setting (`benchmarks/graph_lesson.py`)", "at least 1.3 times"),
    ("the exact forms and the in-step layer table on a GPU (`benchmarks/layers.py`)", "-"),
    ("the tests marked `gpu` and the distributed tests on CUDA since the exact forms", "all pass"),
    ("an Nsight Systems report of a GPU run", "-"),
    ("`submit_pm.sh` with the real `shifter` and `podman-hpc` runtimes on GPU nodes", "-"),
    ("domain parallelism on GPUs: step time, halo overlap, memory per GPU (several GPUs needed)", "-"),
    ("DDP and FSDP over NCCL on several GPUs (`benchmarks/scaling.py` past one GPU)", "-"),
]


def sources(root=ROOT):
    """The result notes, sorted by path (this file itself excluded)."""
    paths = {os.path.relpath(path, root) for pattern in SOURCES
             for path in glob.glob(os.path.join(root, pattern), recursive=True)}
    return sorted(path for path in paths if path != NOTES)


def device_of(provenance, text, path):
    """The device its provenance line names, else the one its text names first, else its file's or folder's
    name, else "-"."""
    named = next((device for key, device in DEVICES if key in provenance), None)
    first = sorted((text.find(key), device) for key, device in DEVICES if key in text)
    return named or (first[0][1] if first else next((device for key, device in PATH_DEVICES if key in path), "-"))


def describe(root, path):
    """``{title, provenance, device, date, path}`` of one result note."""
    text = open(os.path.join(root, path), encoding="utf-8").read()
    lines = [line.strip() for line in text.splitlines()]
    headings = [line[2:].strip() for line in lines if line.startswith("# ")]
    provenance = next((line for line in lines if PROVENANCE.match(line)),
                      next((line for line in lines if line and not line.startswith(("#", "|"))), ""))
    title = headings[0] if headings else os.path.splitext(os.path.basename(path))[0]
    dates = DATE.findall(provenance) or DATE.findall(path) or DATE.findall(text)
    return {"title": title, "provenance": provenance, "device": device_of(provenance, text, path),
            "date": dates[0] if dates else "-", "path": path}


def kind_of(path):
    """The result's group: the tool's folder under benchmarks/results/, or the top folder."""
    parts = path.split("/")
    if parts[:2] == ["benchmarks", "results"]:
        return "ladder" if len(parts) == 3 else parts[2]
    return parts[0]


def link(path):
    return os.path.relpath(path, os.path.dirname(NOTES))


def status_table(entries):
    devices = sorted({entry["device"] for entry in entries})
    kinds = sorted({kind_of(entry["path"]) for entry in entries})
    rows = ["| results | " + " | ".join(devices) + " |", "|---|" + "---|" * len(devices)]
    for kind in kinds:
        cells = []
        for device in devices:
            dates = sorted({entry["date"] for entry in entries
                            if kind_of(entry["path"]) == kind and entry["device"] == device})
            cells.append(", ".join(dates) if dates else "")
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    return rows


def render(root=ROOT):
    entries = [describe(root, path) for path in sources(root)]
    out = ["# Measurement notes",
           "",
           "Made by `python -m benchmarks.notes` from the committed results; do not edit by hand. Each",
           "entry links a results file and quotes its own provenance line: the command, device, versions and",
           "date that made it. A number in the chapters comes from one of these files.",
           "",
           "## What has run where",
           "",
           "The dates of the committed results of each kind, by device.",
           "",
           *status_table(entries),
           "",
           "## Not measured yet",
           "",
           "| what | target |",
           "|---|---|",
           *[f"| {what} | {target} |" for what, target in NOT_MEASURED],
           "",
           "## The results"]
    for kind in sorted({kind_of(entry["path"]) for entry in entries}):
        out += ["", f"### {kind}", ""]
        for entry in (entry for entry in entries if kind_of(entry["path"]) == kind):
            out.append(f"- [{entry['title']}]({link(entry['path'])}) ({entry['device']}, {entry['date']}): "
                       f"{entry['provenance']}")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed notes; write nothing")
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    notes, path = render(args.root), os.path.join(args.root, NOTES)
    if args.check:
        committed = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if committed != notes:
            sys.stdout.writelines(difflib.unified_diff(committed.splitlines(True), notes.splitlines(True),
                                                       NOTES, "made now"))
            print(f"\n{NOTES} is not what the results make: run `make notes` (python -m benchmarks.notes) and "
                  "commit it.")
            return 1
        return 0
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(notes)
    os.replace(temporary, path)
    print(f"wrote {NOTES}: {notes.count(chr(10) + '- [')} results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
