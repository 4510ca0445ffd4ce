"""benchmarks/notes.py: the measurement notes (benchmarks/results/README.md) are what the committed results
make, each result listed with its own provenance line, device and date, and with its trials, spread and noise
verdict read from its results file."""
import json
import os
import statistics
import subprocess
import sys

from benchmarks import notes
from utils import noise
from conftest import ROOT, timeout_for


def test_the_committed_notes_are_what_the_results_make():
    result = subprocess.run([sys.executable, "-m", "benchmarks.notes", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(60))
    assert result.returncode == 0, result.stdout[-3000:]


def test_every_relative_link_of_the_committed_notes_exists():
    """The provenance lines are copied from notes one or two folders down: their links are rebased."""
    with open(os.path.join(ROOT, notes.NOTES)) as f:
        targets = notes.LINK.findall(f.read())
    missing = [t for t in targets if not os.path.exists(os.path.join(ROOT, os.path.dirname(notes.NOTES), t))]
    assert targets and not missing, missing


def test_a_provenance_line_s_links_are_rebased_onto_the_notes_folder():
    line = "After [the runs](../scaling/cpu-vm-2-cores-2026-11-25/README.md#runs), [the model](model.md), " \
           "[NCCL](https://github.com/NVIDIA/nccl) and [below](#below)."
    assert notes.rebased(line, "benchmarks/results/scaling_model/cpu.md") == \
        "After [the runs](scaling/cpu-vm-2-cores-2026-11-25/README.md#runs), [the model](scaling_model/model.md), " \
        "[NCCL](https://github.com/NVIDIA/nccl) and [below](#below)."


def write(root, path, text):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as file:
        file.write(text)


def test_a_new_result_enters_the_notes_with_its_provenance_device_and_date(tmp_path):
    root = str(tmp_path)
    write(root, "benchmarks/results/layers/nvidia-h200-2026-12-01-bf16.md",
          "Measured by `python -m benchmarks.layers --preset gpu` on NVIDIA H200 (torch 2.11.0+cu130), "
          "2026-12-01T10:00:00+00:00: batch 64.\n\n| layer | ms |\n|---|---|\n| last | 17.0 |\n")
    write(root, "benchmarks/results/scaling_model/h100.md",
          "# Predicted\n\nMade by `python -m benchmarks.scaling_model --report`: a computation from published "
          "numbers, for one H100.\n")
    write(root, "example_logs/demo/README.md", "# The demo\n\nMade by `make demo` on the 2-core CPU machine, 2026-11-25.\n")
    assert notes.main(["--root", root, "--check"]) == 1  # nothing written yet
    assert notes.main(["--root", root]) == 0 and notes.main(["--root", root, "--check"]) == 0
    text = open(os.path.join(root, notes.NOTES)).read()
    assert ("- [nvidia-h200-2026-12-01-bf16](layers/nvidia-h200-2026-12-01-bf16.md) (H200, 2026-12-01): Measured by "
            "`python -m benchmarks.layers --preset gpu`") in text
    # A prediction for an H100 is a computation, not a measurement on one.
    assert "| results | CPU (2 cores) | H200 | none (a computation) |\n" in text
    assert "| scaling_model |  |  | - |\n" in text and "| layers |  | 2026-12-01 |  |\n" in text
    assert "(none (a computation), -): Made by `python -m benchmarks.scaling_model --report`" in text
    assert "[The demo](../../example_logs/demo/README.md) (CPU (2 cores), 2026-11-25)" in text
    write(root, "benchmarks/results/precision/cpu-vm-2-cores-2026-12-02.md", "Measured by `x` on CPU, 2026-12-02.\n")
    assert notes.main(["--root", root, "--check"]) == 1  # a result committed without its notes


# The noise of each result, read from committed-format files: a committed results file, copied to a root of
# its own with what the test changes.

def copy_result(root, committed, name, change):
    """The committed results file ``committed`` (and its note) as ``name`` under ``root``, its JSON changed
    by ``change(report)``."""
    folder = os.path.dirname(committed)
    with open(os.path.join(ROOT, committed)) as file:
        report = json.load(file)
    change(report)
    write(root, os.path.join(folder, name + ".json"), json.dumps(report, indent=1))
    with open(os.path.join(ROOT, os.path.splitext(committed)[0] + ".md")) as file:
        write(root, os.path.join(folder, name + ".md"), file.read())


def noise_row(root, name):
    """``[trials, spread, noise]`` of the result named ``name`` in the notes made under ``root``."""
    assert notes.main(["--root", root]) == 0
    text = open(os.path.join(root, notes.NOTES)).read()
    rows = [line for line in text.splitlines() if line.startswith(f"| [{name}](")]
    assert len(rows) == 1, text
    return [cell.strip() for cell in rows[0].strip(" |").split(" | ")[1:]]


def with_trials(full, synthetic, io):
    """A change that gives the ladder's first two rungs FULL, SYNTHETIC and IO trials, as benchmarks/ladder.py
    now keeps them, and leaves out the others."""
    def change(report):
        report["runs"] = report["runs"][:2]
        for entry, *trials in zip(report["runs"], full, synthetic, io):
            for kind, values in zip(("full", "synthetic", "io"), trials):
                entry.setdefault("trials", {})[kind] = noise.summary(values)
                entry[kind] = statistics.fmean(values)
            entry["ntrials"] = len(trials[0])
    return change


LADDER = "benchmarks/results/nvidia-h200-2026-11-26.json"
LAYERS = "benchmarks/results/layers/cpu-vm-2-cores-2026-11-27-fp32-5.json"


def test_a_ladder_whose_trials_agree_is_quiet_and_counts_the_rungs_it_cannot_tell_apart(tmp_path):
    root = str(tmp_path)
    # Rung one's FULL trials 1000 and 1020, rung two's 1500 and 1530: 2.0% apart at most, the rungs well apart.
    copy_result(root, LADDER, "nvidia-h200-2026-12-01", with_trials(
        [[1000, 1020], [1500, 1530]], [[1100, 1105], [1600, 1601]], [[9000, 9010], [9000, 9001]]))
    assert noise_row(root, "nvidia-h200-2026-12-01") == [
        "2 trials x 6 batches, of each of FULL, SYNTHETIC and IO", "2.0%",
        "quiet: spread 2.0%, 0 of 1 differences inside the trials' overlap"]
    # Rung two's trials reaching down into rung one's: the same spread, a difference the trials do not resolve.
    copy_result(root, LADDER, "nvidia-h200-2026-12-01", with_trials(
        [[1000, 1020], [1010, 1030]], [[1100, 1105], [1600, 1601]], [[9000, 9010], [9000, 9001]]))
    assert noise_row(root, "nvidia-h200-2026-12-01")[2] == (
        "quiet: spread 2.0%, 1 of 1 differences inside the trials' overlap")


def test_a_ladder_whose_trials_spread_or_whose_full_passes_its_io_is_noisy(tmp_path):
    root = str(tmp_path)
    copy_result(root, LADDER, "nvidia-h200-2026-12-01", with_trials(
        [[1000, 1020], [1200, 1800]], [[1100, 1105], [1900, 1901]], [[9000, 9010], [9000, 9001]]))
    first, second = (entry["name"] for entry in json.load(open(os.path.join(ROOT, LADDER)))["runs"][:2])
    assert noise_row(root, "nvidia-h200-2026-12-01")[1:] == [
        "40.0%", f"noisy: spread 40.0% ({second}: FULL) over 20.0%"]
    # Means only, as the committed ladders keep them: FULL above IO still says that the load changed.
    def full_above_io(report):
        report["runs"][0]["io"] = report["runs"][0]["full"] - 1
    copy_result(root, LADDER, "nvidia-h200-2026-12-01", full_above_io)
    spread, verdict = noise_row(root, "nvidia-h200-2026-12-01")[1:]
    assert spread == "means only" and verdict.startswith(f"noisy: {first}: FULL above IO: ")


def layers_with_load(start, end, tables):
    def change(report):
        report["load_average"].update(start=start, end=end, cpus=2)
        for table, load in zip(report["in_step"].values(), tables):
            table["load_average"] = load
    return change


def test_layers_are_judged_by_the_highest_load_average_they_record_against_the_cores(tmp_path):
    root = str(tmp_path)
    copy_result(root, LAYERS, "cpu-vm-2-cores-2026-12-01-fp32", layers_with_load(0.7, 1.9, [1.2, 2.0, 1.5]))
    assert noise_row(root, "cpu-vm-2-cores-2026-12-01-fp32") == [
        "3 calls x 1 round a layer; 10 profiled steps a step table", "means only", "quiet: load 2.00 on 2 cores"]
    # One table done while other work shared the 2 cores.
    copy_result(root, LAYERS, "cpu-vm-2-cores-2026-12-01-fp32", layers_with_load(0.7, 1.9, [1.2, 2.01, 1.5]))
    assert noise_row(root, "cpu-vm-2-cores-2026-12-01-fp32")[2] == "noisy: load 2.01 on 2 cores"
    # A file of the layers written before the tool recorded its load says what it cannot judge.
    copy_result(root, LAYERS, "cpu-vm-2-cores-2026-12-01-fp32", lambda report: report.pop("load_average"))
    assert noise_row(root, "cpu-vm-2-cores-2026-12-01-fp32")[2] == "not judged: means only"


def test_a_result_without_repeats_says_so(tmp_path):
    root = str(tmp_path)
    copy_result(root, "benchmarks/results/precision/cpu-vm-2-cores-2026-11-25.json",
                "cpu-vm-2-cores-2026-12-01", lambda report: None)
    assert noise_row(root, "cpu-vm-2-cores-2026-12-01") == [
        "one run of 32 steps a precision", "one measurement", "not judged: one measurement"]


def test_a_results_file_that_does_not_parse_stops_the_notes_and_writes_nothing(tmp_path):
    root = str(tmp_path)
    copy_result(root, LADDER, "nvidia-h200-2026-12-01", lambda report: None)
    write(root, "benchmarks/results/nvidia-h200-2026-12-01.json", "{\"runs\": [")
    result = subprocess.run([sys.executable, "-m", "benchmarks.notes", "--root", root], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_for(60))
    assert result.returncode == 2 and "nvidia-h200-2026-12-01.json is not valid JSON" in " ".join(result.stderr.split())
    assert not os.path.exists(os.path.join(root, notes.NOTES))


def copy_folder(root, committed, change):
    """A committed results folder's notes and JSON files under ``root``, the JSON changed by ``change(name, data)``."""
    for name in sorted(name for name in os.listdir(os.path.join(ROOT, committed)) if name.endswith((".md", ".json"))):
        with open(os.path.join(ROOT, committed, name)) as file:
            text = file.read()
        if name.endswith(".json"):
            data = json.loads(text)
            change(name, data)
            text = json.dumps(data, indent=1)
        write(root, os.path.join(committed, name), text)


def test_a_scaling_point_whose_trials_spread_makes_its_folder_noisy(tmp_path):
    root, folder = str(tmp_path), "benchmarks/results/scaling/cpu-vm-2-cores-2026-11-25"
    copy_folder(root, folder, lambda name, data: None)
    trials, spread, verdict = noise_row(root, "cpu-vm-2-cores-2026-11-25")
    assert trials == "3 trials x 20 batches of FULL a point, 4 points" and spread.endswith("%")
    # One rank, DDP and noddp are the same job: their trials overlap; at two ranks DDP's overhead shows.
    assert verdict == f"quiet: spread {spread}, 1 of 2 differences inside the trials' overlap"

    def spread_out(name, data):
        if name == "ddp_2.json":
            data["FULL"]["trial_throughput"] = [100.0, 140.0, 133.0]
    copy_folder(root, folder, spread_out)
    assert noise_row(root, "cpu-vm-2-cores-2026-11-25")[1:] == ["32.2%", "noisy: spread 32.2% (ddp at 2) over 20.0%"]


def test_a_profile_with_a_stalled_step_is_noisy(tmp_path):
    root, folder = str(tmp_path), "sample_nsys_profiles/cpu"
    copy_folder(root, folder, lambda name, data: None)
    assert noise_row(root, "cpu")[0] == "12 profiled steps a profile" and noise_row(root, "cpu")[2].startswith("quiet")

    def stall(name, data):
        steps = data["profiles"][1]["step_ms"]
        steps[-1] = 3 * statistics.median(steps)
    copy_folder(root, folder, stall)
    verdict = noise_row(root, "cpu")[2]
    assert verdict.startswith("noisy: a step ") and verdict.endswith(" times its series' median (gpu_inmem: step)")


def test_the_graph_lessons_eager_and_graph_trials_are_judged_and_compared(tmp_path):
    root, base = str(tmp_path), "benchmarks/results/graph_lesson/nvidia-h100-80gb-hbm3-2026-12-01"

    def lesson(eager, graph):
        report = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0",
                  "date": "2026-12-01T10:00:00+00:00", "command": "python -m benchmarks.graph_lesson", "steps": 100,
                  "trials": 3, "points": [
                      {"setting": "launch-bound", "local_batch": 1, "eager_ms": noise.summary(eager),
                       "graph_ms": noise.summary(graph),
                       "speedup": statistics.median(eager) / statistics.median(graph)},
                      {"setting": "production", "local_batch": 64, "error": "out of memory"}]}
        write(root, base + ".json", json.dumps(report))
        write(root, base + ".md", "Measured by `python -m benchmarks.graph_lesson` on NVIDIA H100 80GB HBM3, "
                                  "2026-12-01T10:00:00+00:00.\n")
        return noise_row(root, os.path.basename(base))

    assert lesson([10.0, 10.2, 10.1], [7.0, 7.1, 7.05]) == [
        "3 trials x 100 steps a side, eager and graph", "2.0%",
        "quiet: spread 2.0%, 0 of 1 differences inside the trials' overlap"]
    assert lesson([10.0, 10.2, 10.1], [9.9, 10.05, 10.0])[2] == (
        "quiet: spread 2.0%, 1 of 1 differences inside the trials' overlap")
