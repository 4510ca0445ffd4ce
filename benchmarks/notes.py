"""The measurement notes: one index of every committed result, with its provenance and its noise, made from the files.

    python -m benchmarks.notes            # writes benchmarks/results/README.md (make notes)
    python -m benchmarks.notes --check    # exit 1 if the committed notes differ from what the files make

The chapters quote numbers; this index says where each set of numbers came from: the tool's own
provenance line (its command, device, versions and date, as each results file opens), the device and
date, and a link. It also holds the one status table of what has run where, and what is not measured
yet. Nothing here is typed by hand but the list of what is still to measure (:data:`NOT_MEASURED`):
regenerate after committing a result, and tests/test_notes.py fails until you do.

Each result also gets three facts read from its results file (the JSON beside its note; the note itself
where there is none), and never typed by hand:

- trials: the timed measurements each number is made of (benchy's trials x batches, a layer's calls x
  rounds, an all-reduce's repeats, a profile's steps);
- spread: the widest spread of the trial series the file keeps, as utils/noise.py measures it:
  (max - min) / mean of a number's trials, or (third quartile - first quartile) / median of a profile's
  steps. Where the file keeps no series it says why: "one measurement", or "means only" (and the like)
  where the repeats were reduced to one number before they were written;
- the noise verdict, by one rule (:func:`judge`):

  - **noisy** when the spread exceeds 20% (utils/noise.py's ``BUSY_SPREAD``); or an order that must
    hold does not (benchy's FULL above its SYNTHETIC or IO), checked on the means where no trials are
    kept; or a profiled step took more than 2 times its series' median (``STEP_OUTLIER``); or the
    highest 1-minute load average the file records exceeds the host's core count (:data:`LOAD_PER_CORE`
    per core: a benchmark keeps at most one thread runnable per core, so more means that other work
    waited for the cores with it). The reasons follow the word;
  - **quiet** when the file records a spread or a load and none of those holds: the spread and the
    load follow, then how many of the differences the tool reports (two numbers it sets side by side:
    consecutive ladder rungs, DDP against noddp, eager against graph, a profile against the first) lie
    inside their trials' overlap (utils/noise.py's ``separated``). Such a difference is not a finding,
    however quiet the machine;
  - **not judged** when the file records neither: one measurement, summaries only, a computation, byte
    counts. The reason follows.
"""
import argparse
import dataclasses
import difflib
import glob
import json
import os
import re
import statistics
import sys

from utils import noise
from utils.errors import UserError, exit_on_user_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTES = os.path.join("benchmarks", "results", "README.md")
SOURCES = ("benchmarks/results/**/*.md", "example_logs/**/README.md", "sample_nsys_profiles/**/README.md")
PROVENANCE = re.compile(r"^(Measured by|Measured with|Made by|Made with|Two |One )")
DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")
# Devices as the provenance lines name them, in this order (a prediction for an H100 is a computation),
# then as the tools name their result files and folders.
# A CPU named with the vector instructions PyTorch's kernels use (benchmarks/common.py's device_name, from
# 2026-11-29) is told apart: an AVX2-only CPU emulates bf16. The older files do not say.
DEVICES = (("a computation", "none (a computation)"), ("H100", "H100"), ("H200", "H200"),
           ("AVX2)", "CPU (2 cores, AVX2)"), ("CPU", "CPU (2 cores)"), ("2-core", "CPU (2 cores)"))
PATH_DEVICES = (("nvidia-h100", "H100"), ("nvidia-h200", "H200"), ("cpu-vm-2-cores-avx2", "CPU (2 cores, AVX2)"),
                ("cpu-vm-2-cores", "CPU (2 cores)"))

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
    ("domain parallelism on GPUs: step time, the blocking halo exchange's share of it, memory per GPU "
     "(several GPUs needed)", "-"),
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


LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s#]+)")


def rebased(line, path):
    """``line`` of the note ``path`` with its relative links made relative to the notes' own folder."""
    def target(match):
        return "](" + os.path.relpath(os.path.join(os.path.dirname(path), match.group(1)), os.path.dirname(NOTES))
    return LINK.sub(target, line)


def describe(root, path):
    """``{title, provenance, device, date, path}`` of one result note; the provenance's links work from the notes."""
    text = open(os.path.join(root, path), encoding="utf-8").read()
    lines = [line.strip() for line in text.splitlines()]
    headings = [line[2:].strip() for line in lines if line.startswith("# ")]
    provenance = rebased(next((line for line in lines if PROVENANCE.match(line)),
                              next((line for line in lines if line and not line.startswith(("#", "|"))), "")), path)
    title = headings[0] if headings else os.path.splitext(os.path.basename(path))[0]
    dates = DATE.findall(provenance) or DATE.findall(path) or DATE.findall(text)
    evidence = evidence_of(root, path, text)
    spread, verdict = judge(evidence)
    return {"title": title, "provenance": provenance, "device": device_of(provenance, text, path),
            "date": dates[0] if dates else "-", "path": path, "trials": evidence.trials, "spread": spread,
            "noise": verdict}


def kind_of(path):
    """The result's group: the tool's folder under benchmarks/results/, or the top folder."""
    parts = path.split("/")
    if parts[:2] == ["benchmarks", "results"]:
        return "ladder" if len(parts) == 3 else parts[2]
    return parts[0]


def link(path):
    return os.path.relpath(path, os.path.dirname(NOTES))


def label(path):
    """A note's short name: its file's, or its folder's for a README or a note named after its tool."""
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.basename(os.path.dirname(path))
    return folder if stem in ("README", kind_of(path)) else stem


def cell(text):
    return str(text).replace("|", "\\|")


# The noise of each result (the module's docstring holds the rule).

# A highest 1-minute load average above this many per core says that other work waited for the cores.
LOAD_PER_CORE = 1.0
BENCHY_KINDS = ("FULL", "SYNTHETIC", "IO")


@dataclasses.dataclass
class Evidence:
    """What one results file records about its own noise."""
    trials: str  # the timed measurements each number is made of
    unkept: str = "one measurement"  # why the file keeps no trial series, where it keeps none
    series: dict = dataclasses.field(default_factory=dict)  # {name: trials} that the file keeps
    steps: bool = False  # the series are a profile's steps
    means: dict = dataclasses.field(default_factory=dict)  # {name: [mean]}: the numbers kept without their trials
    above: list = dataclasses.field(default_factory=list)  # (higher, lower): orders of names that must hold
    pairs: list = dataclasses.field(default_factory=list)  # (name, name): the differences the tool reports
    load: tuple = None  # (the highest 1-minute load average recorded, the host's cores)


def percent(fraction):
    """"4.2%", or "0.02%" below one percent."""
    return f"{100 * fraction:.{1 if fraction >= 0.01 else 2}f}%"


def plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def span(values):
    """"6", or "5-6" where the values differ; "?" where none is recorded."""
    values = sorted({value for value in values if value is not None})
    return "?" if not values else str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def judge(evidence):
    """``(spread, verdict)`` of one result's :class:`Evidence`, by the rule of the module's docstring."""
    name, spread = noise.widest(evidence.series, noise.middle_spread if evidence.steps else noise.spread)
    spread_text = percent(spread) if name is not None else evidence.unkept
    reasons = []
    if spread > noise.BUSY_SPREAD:
        reasons.append(f"spread {percent(spread)} ({name}) over {percent(noise.BUSY_SPREAD)}")
    reasons += noise.broken_orders({**evidence.means, **evidence.series}, evidence.above)[:1]
    if evidence.steps:
        stalled = max(((max(steps) / statistics.median(steps), key) for key, steps in evidence.series.items()
                       if len(steps) >= 4), default=(0.0, None))
        if stalled[0] > noise.STEP_OUTLIER:
            reasons.append(f"a step {stalled[0]:.1f} times its series' median ({stalled[1]})")
    load_text = evidence.load and f"load {evidence.load[0]:.2f} on {evidence.load[1]} cores"
    if evidence.load and evidence.load[0] > LOAD_PER_CORE * evidence.load[1]:
        reasons.append(load_text)
    if reasons:
        return spread_text, "noisy: " + "; ".join(reasons)
    if name is None and not evidence.load:
        return spread_text, f"not judged: {evidence.unkept}"
    facts = ([f"spread {spread_text}"] if name is not None else []) + ([load_text] if evidence.load else [])
    pairs = [(a, b) for a, b in evidence.pairs if len(evidence.series.get(a, [])) and len(evidence.series.get(b, []))]
    if pairs:
        inside = sum(not noise.separated(evidence.series[a], evidence.series[b]) for a, b in pairs)
        facts.append(f"{inside} of {len(pairs)} differences inside the trials' overlap")
    return spread_text, "quiet: " + ", ".join(facts)


def ladder_evidence(report, folder):
    """benchmarks/ladder.py's report (the ladder, the loaders): each rung's benchy FULL, SYNTHETIC and IO;
    the differences it reports, each rung's FULL against the one before it in its table."""
    entries = [dict(entry, table=entry.get("table", "ladder")) for entry in report["runs"]]
    entries += [dict(entry, table="batch") for entry in report.get("batch_sweep", [])]
    entries = [entry for entry in entries if "error" not in entry]
    evidence = Evidence("", unkept="means only")
    for entry in entries:
        for kind in BENCHY_KINDS:
            key, trials = f"{entry['name']}: {kind}", entry.get("trials", {}).get(kind.lower(), {}).get("trials")
            if trials:
                evidence.series[key] = trials
            elif entry.get(kind.lower()) is not None:
                evidence.means[key] = [entry[kind.lower()]]
        evidence.above += [(f"{entry['name']}: {high}", f"{entry['name']}: {low}") for high, low in noise.BENCHY_ORDER]
    for table in sorted({entry["table"] for entry in entries}):
        rungs = sorted((entry for entry in entries if entry["table"] == table), key=lambda entry: entry.get("step", 0))
        evidence.pairs += [(f"{a['name']}: FULL", f"{b['name']}: FULL") for a, b in zip(rungs, rungs[1:])]
    counts = [len(evidence.series.get(f"{entry['name']}: FULL", [])) or entry.get("ntrials") for entry in entries]
    batches = span(entry.get("nbatches") for entry in entries)
    evidence.trials = (f"{span(counts)} trials x {batches} batches, of each of FULL, SYNTHETIC and IO"
                       if all(counts) else f"{batches} batches a trial; trials not recorded")
    return evidence


def layers_evidence(report, folder):
    """benchmarks/layers.py's report: each layer's mean of its calls (the least of its rounds), the tables of
    the step layer by layer over their profiled steps, and the host's load average as each part was done."""
    tables = list(report.get("in_step", {}).values())
    rounds = report.get("rounds") or 1
    trials = (f"{report['repeats']} calls x {plural(rounds, 'round')} a layer" if report.get("repeats")
              else "calls a layer not recorded")
    if tables:
        trials += f"; {span(table.get('steps') for table in tables)} profiled steps a step table"
    recorded = report.get("load_average") or {}
    loads = [recorded.get("start"), recorded.get("end"), *(table.get("load_average") for table in tables)]
    loads = [value for value in loads if value is not None]
    return Evidence(trials, unkept="the least of the rounds' means only" if rounds > 1 else "means only",
                    load=(max(loads), recorded["cpus"]) if loads and recorded.get("cpus") else None)


def scaling_evidence(report, folder):
    """benchmarks/scaling.py's index: each point's benchy JSON beside it, whose FULL trials the table quotes;
    the differences it reports, DDP against noddp at each number of ranks."""
    evidence = Evidence("", unkept="no point kept its trials")
    batches = []
    for point in (point for point in report["points"] if "file" in point):
        full = read_json(os.path.join(folder, point["file"]))["FULL"]
        evidence.series[f"{point['mode']} at {point['ranks']}"] = full["trial_throughput"]
        batches.append(full.get("nbatches"))
    ranks = sorted({point["ranks"] for point in report["points"]})
    evidence.pairs = [(f"ddp at {n}", f"noddp at {n}") for n in ranks]
    evidence.trials = (f"{span(len(trials) for trials in evidence.series.values())} trials x {span(batches)} batches "
                       f"of FULL a point, {len(evidence.series)} points")
    return evidence


def graph_lesson_evidence(report, folder):
    """benchmarks/graph_lesson.py's report: each point's eager and graph trials; the differences it reports,
    eager against graph at each point."""
    evidence = Evidence(f"{report['trials']} trials x {report['steps']} steps a side, eager and graph")
    for point in (point for point in report["points"] if "error" not in point):
        name = f"{point['setting']}, batch {point['local_batch']}"
        for side in ("eager", "graph"):
            evidence.series[f"{name}: {side}"] = point[f"{side}_ms"]["trials"]
        evidence.pairs.append((f"{name}: eager", f"{name}: graph"))
    return evidence


def profiles_evidence(report, folder):
    """benchmarks/profiles.py's index: each profile's steps (their times and their forward passes'); the
    differences it reports, each profile's steps against the first's."""
    profiles = report["profiles"]
    evidence = Evidence(f"{span(profile.get('steps') for profile in profiles)} profiled steps a profile",
                        unkept="means per step only", steps=True)
    for profile in profiles:
        for series in ("step", "forward"):
            if profile.get(f"{series}_ms"):
                evidence.series[f"{profile['rung']}: {series}"] = profile[f"{series}_ms"]
    evidence.pairs = [(f"{profiles[0]['rung']}: step", f"{profile['rung']}: step") for profile in profiles[1:]]
    return evidence


def allreduce_evidence(report, folder):
    """benchmarks/allreduce.py's profile: one time a message size, the median of repeats its command names."""
    repeats = re.search(r"--(?:repeats|iters)[= ](\d+)", report.get("command", ""))
    return Evidence(f"the median of {repeats.group(1)} all-reduces a size" if repeats else "repeats not recorded",
                    unkept="medians only")


def precision_evidence(report, folder):
    """benchmarks/precision.py's report: one training run a precision, its losses and spectra."""
    return Evidence(f"one run of {span(rung.get('steps') for rung in report['rungs'])} steps a precision")


def domain_evidence(report, folder):
    """benchmarks/domain.py's report: bytes counted, not timed."""
    return Evidence(f"one count a row, {len(report['rows'])} rows", unkept="bytes counted, not timed")


def note_evidence(text, kind):
    """A result with no results file beside its note: what its note says of its repeats."""
    if kind == "scaling_model":
        return Evidence("none", unkept="a computation, not a measurement")
    phase = re.search(r"(\d+) steps a phase", text)
    if phase:
        return Evidence(f"{phase.group(1)} steps a phase", unkept="medians only")
    return Evidence("not recorded", unkept="no results file beside its note")


READERS = {"ladder": ladder_evidence, "loaders": ladder_evidence, "layers": layers_evidence,
           "scaling": scaling_evidence, "graph_lesson": graph_lesson_evidence, "allreduce": allreduce_evidence,
           "precision": precision_evidence, "domain": domain_evidence, "example_logs": profiles_evidence,
           "sample_nsys_profiles": profiles_evidence}
# The results file of a note: the JSON of its own name, else the index its tool writes into its folder.
FOLDER_RESULTS = ("scaling.json", "profiles.json")


def read_json(path):
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except ValueError as error:
        raise UserError(f"{path} is not valid JSON ({error}), so the measurement notes cannot read its trials. Restore "
                        "it from git (git checkout -- <file>) or rerun the tool that wrote it; nothing was written.")


def evidence_of(root, path, text):
    """The :class:`Evidence` of the result whose note is ``path`` (relative to ``root``)."""
    folder = os.path.dirname(os.path.join(root, path))
    candidates = [os.path.splitext(os.path.join(root, path))[0] + ".json",
                  *(os.path.join(folder, name) for name in FOLDER_RESULTS)]
    found = next((candidate for candidate in candidates if os.path.exists(candidate)), None)
    kind = kind_of(path)
    if found is None or kind not in READERS:
        return note_evidence(text, kind)
    try:
        return READERS[kind](read_json(found), folder)
    except (KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{os.path.relpath(found, root)} lacks what benchmarks/notes.py reads of a {kind} result "
                        f"({error!r}). Rerun the tool that wrote it, or teach benchmarks/notes.py its format; nothing "
                        "was written.")


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
           "## The results",
           "",
           "Each kind's table gives what each results file records of its noise: the trials each number is made "
           "of; their widest spread, (max - min) / mean of a number's trials, or (third quartile - first quartile) "
           "/ median of a profile's steps; and a verdict, by the rule in `benchmarks/notes.py`:",
           "",
           f"- **noisy**: a spread over {percent(noise.BUSY_SPREAD)}, FULL above SYNTHETIC or IO, a profiled step "
           f"over {noise.STEP_OUTLIER:g} times its series' median, or a 1-minute load average over "
           f"{LOAD_PER_CORE:g} per core.",
           "- **quiet**: a spread or a load recorded, and none of those. It counts the differences the tool reports "
           "that lie inside their trials' overlap: those are not findings.",
           "- **not judged**: neither recorded; the reason follows.",
           ]
    for kind in sorted({kind_of(entry["path"]) for entry in entries}):
        out += ["", f"### {kind}", "", "| result | trials | spread | noise |", "|---|---|---|---|"]
        out += [f"| [{label(entry['path'])}]({link(entry['path'])}) | "
                + " | ".join(cell(entry[key]) for key in ("trials", "spread", "noise")) + " |"
                for entry in entries if kind_of(entry["path"]) == kind]
        out.append("")
        for entry in (entry for entry in entries if kind_of(entry["path"]) == kind):
            out.append(f"- [{entry['title']}]({link(entry['path'])}) ({entry['device']}, {entry['date']}): "
                       f"{entry['provenance']}")
    return "\n".join(out) + "\n"


@exit_on_user_error
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
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(notes)
    os.replace(temporary, path)
    print(f"wrote {NOTES}: {notes.count(chr(10) + '- [')} results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
