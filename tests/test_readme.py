"""The tutorial, README.md (the hub) and its chapters docs/*.md: links, images and section anchors exist;
every chapter is linked from the hub; the Quick start is there; every command they show is either run
here on CPU or listed with the reason it is not.

Every command of their ```bash blocks (tests/readme_commands.py extracts them, hub first, then the
chapters in order) must appear in
RUN or in NOT_RUN below; a command in neither fails `test_every_readme_command_is_classified`, so a
new command cannot enter the README untested by accident. RUN commands are run as written, in reading order, in
one scratch copy (links to the code, nothing written into the repository), with tiny sizes appended where
they train: a reader's session, each command finding what the earlier ones left. Each must exit 0 and
make what it promises, checked on the files it made or changed; each command's result is its own test.
"""
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import h5py
import numpy as np
import pytest
import torch
import yaml

import quotes
from benchmarks import nsight
from conftest import ROOT, dali_installed, needs_dali, timeout_for
from readme_commands import copy_data, make_scratch, readme_commands, shell_line, tutorial_text, tutorial_texts
from utils.generate_data import generate_box, write_h5

FILES = tutorial_texts(ROOT)  # {"README.md": ..., "docs/01-...md": ...}, in reading order
README = FILES["README.md"]
TEXT = tutorial_text(ROOT)


def relative_targets(text):
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not target.startswith(("http://", "https://", "#", "mailto:")):
            yield target.split("#")[0]


def resolve(path, target):
    """A link's target in the file ``path`` (relative to the repository), as a path relative to the repository."""
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def section(heading):
    """The text under ``heading`` (a whole heading line, e.g. "### Large-batch convergence") in whichever file
    of the tutorial holds it (tests/quotes.py's section)."""
    found = [path for path, text in FILES.items() if re.search(rf"^{re.escape(heading)}$", text, flags=re.M)]
    assert found, f"no file of the tutorial has the heading {heading!r}"
    return quotes.section(found[0], heading.split(" ", 1)[1])


def anchors(text):
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_relative_link_and_image_exists():
    checked = 0
    for path, text in FILES.items():
        targets = [resolve(path, target) for target in relative_targets(text) if target]
        missing = [t for t in targets if not os.path.exists(os.path.join(ROOT, t))]
        assert not missing, (path, missing)
        checked += len(targets)
    assert checked, "the tutorial links to the code"


def test_every_section_link_has_its_heading():
    """``#anchor`` links within a file, and ``file.md#anchor`` links to another file of the tutorial."""
    checked = 0
    for path, text in FILES.items():
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            destination = resolve(path, target) if target else path
            assert destination in FILES, f"{path} links to {target}#{anchor}, not a file of the tutorial"
            assert anchor in anchors(FILES[destination]), f"{path}: no heading for #{anchor} in {destination}"
            checked += 1
    assert checked, "the tutorial links to its own sections"


CHAPTER_LIST = "## Chapters"  # the hub's list of the chapters


def test_the_hub_links_every_chapter_in_order():
    """README.md links each docs/*.md; the chapters' numbers give the reading order (the in-order test's)."""
    chapters = [path for path in FILES if path != "README.md"]
    assert chapters and all(re.fullmatch(r"docs/\d\d-[\w-]+\.md", path) for path in chapters), chapters
    listed = [resolve("README.md", t) for t in relative_targets(section(CHAPTER_LIST))]
    listed = sorted(set(listed) & set(chapters), key=listed.index)
    assert listed == chapters, f"the hub's {CHAPTER_LIST!r} lists every chapter, in their order: {listed}"


def test_quick_start_has_the_two_commands_and_ci_runs_the_second():
    """The Quick start's first block: `make demo`, then the maintainers' `make test...`, labelled as theirs; CI
    runs the whole suite. The learner's path (the session plan and the tracks) runs no tests."""
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    from readme_commands import commands
    block = quick_start.split("```bash\n", 1)[1].split("```", 1)[0]
    assert commands(block)[0] == "make demo" and re.fullmatch(r"make test(-fast)?", commands(block)[1])
    assert len(commands(block)) == 2 and "maintainers" in block.splitlines()[1]
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^make test$", ci, flags=re.M)
    for heading in ("## A 3-4 hour session", *TRACKS):
        assert "make test" not in section(heading), heading


def table_rows(text):
    """The header and {first cell: {column: cell}} of the first markdown table in ``text``."""
    lines = text[text.index("\n|") + 1:].split("\n\n", 1)[0].splitlines()
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines
            if line.startswith("|") and not line.startswith("|---")]
    return rows[0], {row[0]: dict(zip(rows[0], row)) for row in rows[1:]}


RESULTS_LINK = r"\]\(((?:\.\./)*benchmarks/results/[^)]+\.md)\)"


def results_table(path):
    with open(os.path.join(ROOT, path)) as f:
        return table_rows(f.read())


def test_quoted_benchmark_numbers_are_those_of_the_results_file_linked():
    """A table right after a paragraph that links a results file (benchmarks/results/**/*.md) repeats that
    file's rows; a row of a table keyed like a results file (its first column's name) that links one repeats
    that file's row for the same first column."""
    checked = 0
    for path, text in FILES.items():
        for link in re.finditer(RESULTS_LINK, text):  # a paragraph with the link, then the table
            rest = text[link.end():]
            if "\n\n" not in rest or not rest[rest.index("\n\n") + 2:].startswith("|"):
                continue
            results = resolve(path, link.group(1))
            header, measured = results_table(results)
            quoted_header, quoted = table_rows(rest)
            assert set(quoted_header) <= set(header), (path, quoted_header, header)
            for name, cells in quoted.items():
                assert name in measured, f"{path} quotes a row {name!r} that {results} does not have"
                assert cells == {column: measured[name][column] for column in cells}, (name, cells, measured[name])
                checked += 1
        for table in re.findall(r"(?:^\|.*\n)+", text, flags=re.M):  # rows that link their own results file
            quoted_header, quoted = table_rows("\n" + table)
            for cells in quoted.values():
                link = re.search(RESULTS_LINK, " ".join(cells.values()))
                if not link:
                    continue
                header, measured = results_table(resolve(path, link.group(1)))
                if header[0] not in quoted_header:  # a row that links a file as its source, not one of its rows
                    continue
                row = measured[cells[header[0]]]
                shared = [column for column in quoted_header if column in header]
                assert len(shared) >= 3 and all(cells[column] == row[column] for column in shared), (cells, row)
                checked += 1
    assert checked >= 7, "the tutorial quotes the CPU ladder, the CPU scaling run and the DDP knobs"


def test_the_ladder_table_puts_the_h100_and_h200_beside_the_originals_a100():
    """docs/03's one ladder table: each rung's FULL and MFU on the H100 and the H200 are those of their results
    files, and the original's A100 cells are its README's benchy FULL (benchmarks/original.py)."""
    from benchmarks.original import PUBLISHED_A100_FULL
    text = quotes.section("docs/03-profiling-and-optimisation.md", "The optimisation ladder")
    header, rows = table_rows("\n" + text[text.index("| rung | H100 FULL"):])
    files = {"H100": "benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-25.md",
             "H200": "benchmarks/results/nvidia-h200-2026-11-26.md"}
    measured = {device: results_table(path)[1] for device, path in files.items()}
    assert list(rows) == list(measured["H100"]) == list(measured["H200"])  # every rung, in the ladder's order
    original = header[-1]
    for name, cells in rows.items():
        for device, table in measured.items():
            assert cells[f"{device} FULL"] == table[name]["FULL"], (device, name)
            assert cells[f"{device} MFU (full)"] == table[name]["MFU (full)"], (device, name)
        if cells[original]:
            rung, full = cells[original].rsplit(": ", 1)
            assert PUBLISHED_A100_FULL[rung] == float(full), (name, cells[original])
    assert sum(bool(cells[original]) for cells in rows.values()) == 3


def test_every_cpu_scaling_command_names_its_ranks():
    """Without --ranks the CPU preset runs 1, 2, 4, ... up to every core of the machine: ten torchrun runs on
    a 16-core GPU node. The README's CPU commands name the sizes they were measured with (the GPU
    preset's default, every GPU of the node, is what it is for)."""
    commands = [command for command in readme_commands(TEXT) if "benchmarks.scaling --preset cpu" in command]
    assert len(commands) >= 4 and all("--ranks" in command for command in commands), commands


def test_the_loader_ratio_quoted_is_that_of_the_ladder():
    """The GPU-resident loader's IO over that of the original's lowmem, in the CPU ladder's results file, is the
    ratio the hub's CPU track and chapter 03's loader and ladder sections quote."""
    def ratio(results):
        with open(os.path.join(ROOT, "benchmarks", "results", results)) as f:
            io = {run["name"]: run["io"] for run in json.load(f)["runs"]}
        lowmem = io["original's lowmem: 24 rotations, velocities not turned, 2 workers"]
        return f"{io['gpu-inmem on CPU tensors'] / lowmem:.1f}"

    ladder = next(row for row in track_rows("## CPU track")
                  if "`python -m benchmarks.ladder --preset cpu`" in row["command"])
    native = ratio("cpu-vm-2-cores-2026-11-25.json")
    quotes.assert_quoted(ladder["the number to compare"], native)
    quotes.assert_quoted(quotes.prose(quotes.section("docs/03-profiling-and-optimisation.md", "Data loading")), native)
    # The same ladder on an AVX2-only CPU (benchmarks/results/README.md lists its results), in the chapter.
    loading = quotes.prose(quotes.section("docs/03-profiling-and-optimisation.md", "Data loading"))
    assert f"On an AVX2-only CPU it was {ratio('cpu-vm-2-cores-avx2-2026-11-29.json')} times." in loading


def test_the_prefetchers_numbers_are_those_of_the_h100_loader_rungs():
    """docs/09's reading of the device prefetcher: step times, the IO difference and the bandwidth a copy would
    need, recomputed from the loaders' results file it links (batch 64, a 604 MB batch, PCIe Gen5 x16's 64 GB/s)."""
    with open(os.path.join(ROOT, "benchmarks", "results", "loaders", "nvidia-h100-80gb-hbm3-2026-11-25.json")) as f:
        runs = {run["name"]: run for run in json.load(f)["runs"]}
    with_it, without = runs["lowmem, 8 workers + device prefetch"], runs["lowmem, 8 workers"]
    batch, batch_bytes = 64, 64 * 64 ** 3 * 9 * 4
    ms = {(name, kind): 1e3 * batch / run[kind] for name, run in (("with", with_it), ("without", without))
          for kind in ("full", "synthetic")}
    copy_s = (ms["without", "synthetic"] - ms["with", "synthetic"]) / 1e3
    expected = [f"{ms['without', 'full']:.1f}", f"{ms['without', 'synthetic']:.1f}",
                f"{ms['without', 'full'] - ms['without', 'synthetic']:.0f}",
                f"{100 * (with_it['full'] / without['full'] - 1):.1f}", f"{ms['with', 'full']:.1f}",
                f"{100 * (with_it['io'] / without['io'] - 1):.1f}", f"{copy_s * 1e3:.1f}",
                f"{ms['with', 'synthetic']:.1f}",
                f"{batch_bytes / 1e6:.0f}", f"{batch_bytes / 64e9 * 1e3:.1f}", f"{batch_bytes / copy_s / 1e9:.0f}"]
    import quotes
    quotes.assert_quoted(quotes.section("docs/09-going-further.md", "The device prefetcher, measured"), *expected)


def ladder_runs(path):
    """{rung: its run} of a committed ladder's results JSON (a path relative to the repository)."""
    with open(os.path.join(ROOT, path)) as f:
        return {run["name"]: run for run in json.load(f)["runs"]}


H100_LADDER, H200_LADDER = "benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-25.json", \
    "benchmarks/results/nvidia-h200-2026-11-26.json"


def test_docs_03_derives_its_copy_graph_and_peak_numbers_from_the_ladders():
    """docs/03: the H100's copy of a 604 MB batch (a SYNTHETIC step with the copy against the GPU-resident one's),
    what the CUDA graph saved at batch 8, the ladder's MFU peaks per precision (the files' MFU implies the model's
    80.5 GFLOP only with TF32's peak in the first row and 16-bit's in the others). The H200's repeat of the small
    gains is checked in their steps' sections (test_each_step_of_docs_03_says_what_you_should_see_on_a_gpu)."""
    from utils.flops import PEAK_TFLOPS_TABLE

    chapter = "docs/03-profiling-and-optimisation.md"
    h100 = ladder_runs(H100_LADDER)
    loaders = ladder_runs("benchmarks/results/loaders/nvidia-h100-80gb-hbm3-2026-11-25.json")
    with_copy, without = 64e3 / loaders["lowmem, 8 workers"]["synthetic"], 64e3 / h100["gpu-inmem"]["synthetic"]
    batch_bytes = 64 * 64 ** 3 * 9 * 4
    quotes.assert_quoted(quotes.prose(quotes.section(chapter, "Data loading")), f"{batch_bytes / 1e6:.0f}",
                         f"{with_copy - without:.0f}", f"{batch_bytes / (with_copy - without) / 1e6:.0f}",
                         f"{with_copy:.1f}", f"{without:.1f}")
    eager, graph = (8e3 / h100[rung]["full"] for rung in ("batch 8: gpu-inmem bf16 fused", "batch 8: + CUDA graph"))
    quotes.assert_quoted(quotes.section(chapter, "CUDA graphs"), f"{eager - graph:.1f}", f"{eager:.1f}")

    peaks = dict(PEAK_TFLOPS_TABLE)["H100"]
    ladder = quotes.section(chapter, "The optimisation ladder")
    quotes.assert_quoted(ladder, peaks["tf32"], peaks["bf16"])
    assert round(peaks["bf16"] / peaks["tf32"]) == 2  # "the bf16 peak is twice TF32's"
    for name, run in h100.items():
        peak = peaks[run["precision"]]
        assert peak == (peaks["tf32"] if name == "gpu-inmem" else peaks["bf16"]), (name, run["precision"])
        assert run["mfu"]["full"] * peak * 1e12 / run["full"] == pytest.approx(80.46e9, rel=2e-3), name


def test_each_step_of_docs_03_says_what_you_should_see_on_a_gpu():
    """Chapter 03's step sections end with this code's GPU result of that step: each samples/s, ratio, gain
    (whole percent: the ladders ran 2 trials and recorded no spread), busy share and kernel time they quote is
    recomputed from the committed ladders (H100 and H200), the loaders' rungs and the profiles' summaries."""
    chapter = "docs/03-profiling-and-optimisation.md"
    h100, h200 = ladder_runs(H100_LADDER), ladder_runs(H200_LADDER)
    loaders = ladder_runs("benchmarks/results/loaders/nvidia-h100-80gb-hbm3-2026-11-25.json")
    dali = ladder_runs("benchmarks/results/loaders/nvidia-h200-2026-11-26.json")["DALI (bf16, fused)"]

    def profile(folder):
        with open(os.path.join(ROOT, folder, "profiles.json")) as f:
            return {entry["file"].split(".")[0]: entry for entry in json.load(f)["profiles"]}

    traces, dali_trace = profile("sample_nsys_profiles"), profile("sample_nsys_profiles/dali")["dali_bf16_fused"]

    def gain(ladder, rung, before):
        return 100 * (ladder[rung]["full"] / ladder[before]["full"] - 1)

    def text(heading):
        return quotes.section(chapter, heading)

    bf16, fused = "gpu-inmem + AMP bf16", "+ fused Adam (bf16)"
    quotes.assert_quoted(text("Data loading"), *(f"{loaders[rung]['full']:.1f}" for rung in (
        "baseline: lowmem, 2 workers", "lowmem, 8 workers")), f"{h100['gpu-inmem']['full']:.1f}",
        f"{100 * traces['gpu_inmem']['device_busy']:.0f}", f"{dali['full']:.1f}",
        f"{100 * dali['full'] / h200[fused]['full']:.0f}", f"{100 * dali_trace['device_busy']:.0f}")
    assert abs(loaders["lowmem, 8 workers"]["synthetic"] / 800 - 1) < 0.01  # "SYNTHETIC stayed near 800"
    assert round(h100["gpu-inmem"]["full"] / loaders["baseline: lowmem, 2 workers"]["full"]) == 9  # "Nine times"
    quotes.assert_quoted(text("Data loading"), f"{100 - 100 * dali['full'] / h200[fused]['full']:.0f}",  # "within 6%"
                         f"{(1024 ** 3 + 512 ** 3) * 9 * 4 / 1e9:.1f}")  # the real boxes, 9 channels of float32

    speedups = {f"{ladder[bf16]['full'] / ladder['gpu-inmem']['full']:.1f}" for ladder in (h100, h200)}
    assert len(speedups) == 1  # "1.5 times ... and on the H200 too"
    fp16 = gain(h100, "gpu-inmem + AMP fp16 + fused Adam", fused)
    assert abs(fp16) < 2  # "fp16 came within 2% of bf16"
    quotes.assert_quoted(text("Mixed precision"), *speedups, f"{h100[bf16]['full']:.1f}",
                         f"{h100['gpu-inmem']['full']:.1f}", f"{traces['gpu_inmem_bf16']['kernel_ms_per_step']:.0f}",
                         f"{traces['gpu_inmem']['kernel_ms_per_step']:.0f}")

    layout = "+ channels_last (bf16, fused)"
    quotes.assert_quoted(text("The channels_last memory layout"), f"{h100[layout]['full']:.1f}",
                         *(f"{gain(ladder, layout, fused):.0f}" for ladder in (h100, h200)))

    optimiser = {name: traces[name]["phase_ms_per_step"]["optimizer"] for name in ("gpu_inmem", "gpu_inmem_bf16")}
    assert abs(gain(h100, "+ TorchScript loss (bf16, fused)", fused)) < 1  # "The TorchScript loss: no change"
    quotes.assert_quoted(text("Fused Adam, JIT"), *(f"{gain(ladder, fused, bf16):.0f}" for ladder in (h100, h200)),
                         f"{gain(h100, '+ torch.compile (bf16, fused)', fused):.0f}", f"{min(optimiser.values()):.1f}",
                         f"{max(optimiser.values()):.1f}",
                         f"{traces['gpu_inmem_bf16_fused_jit']['phase_ms_per_step']['optimizer']:.1f}")

    eight, graph = "batch 8: gpu-inmem bf16 fused", "batch 8: + CUDA graph"
    assert abs(gain(h100, "+ CUDA graph (bf16, fused)", fused)) < 1  # "nothing at batch 64"
    quotes.assert_quoted(text("CUDA graphs"), f"{h100[graph]['full']:.1f}", f"{h100[eight]['full']:.1f}",
                         *(f"{gain(ladder, graph, eight):.0f}" for ladder in (h100, h200)),
                         f"{traces['gpu_inmem_bf16_graph']['phase_ms_per_step']['step']:.1f}",
                         f"{traces['gpu_inmem_bf16_graph']['kernel_ms_per_step']:.0f}")

    # The ladder: the best rung against the lowmem baseline, its MFU, and the earlier version's run time.
    with open(os.path.join(ROOT, "benchmarks/results/gpu_suite/gpu_suite-ladder-2026-11-25.log")) as f:
        seconds = re.search(r"step ladder ended with status 0 after (\d+) s", f.read()).group(1)
    quotes.assert_quoted(text("The optimisation ladder"), seconds,
                         f"{h100[layout]['full'] / loaders['baseline: lowmem, 2 workers']['full']:.1f}",
                         f"{h100[layout]['mfu']['full']:.3f}")


def test_the_precision_reading_is_that_of_the_committed_run():
    """Chapter 03's reading of the CPU precision check: the three precisions' validation losses within 0.02% of
    each other, the P ratio at the top wavenumber about 5 in each and within 1% across them, no step skipped."""
    with open(os.path.join(ROOT, "benchmarks/results/precision/cpu-vm-2-cores-2026-11-25.json")) as f:
        rungs = {rung["name"]: rung for rung in json.load(f)["rungs"]}
    losses = [rung["val_loss"] for rung in rungs.values()]
    ratios = [rung["Pk_ratio_top"] for rung in rungs.values()]
    text = quotes.section("docs/03-profiling-and-optimisation.md", "Mixed precision")
    quotes.assert_quoted(quotes.prose(text), f"{100 * (max(losses) / min(losses) - 1):.2f}",
                         *{f"{ratio:.0f}" for ratio in ratios})
    assert max(ratios) / min(ratios) - 1 < 0.01 and rungs["fp16"]["skipped_steps"] == 0
    # The same check on an AVX2-only CPU, which emulates bf16: its bf16 against fp32, in the chapter's caption and
    # in the hub's CPU track.
    with open(os.path.join(ROOT, "benchmarks/results/precision/cpu-vm-2-cores-avx2-2026-11-29.json")) as f:
        avx2 = {rung["name"]: rung["val_loss"] for rung in json.load(f)["rungs"]}
    difference = f"{100 * (avx2['bf16'] / avx2['fp32'] - 1):+.2f}"
    row = next(row for row in track_rows("## CPU track") if "benchmarks.precision" in row["command"])
    assert f"AVX2: {difference}%" in row["the number to compare"] and f"{difference}%" in text


def test_docs_09_derives_its_mfu_h200_and_cpu_layer_readings_from_the_files():
    """docs/09: this code's SYNTHETIC MFU on the H100 against the original's A100 (the peaks' and the memories'
    ratios from the datasheets, the steps' from the samples/s); the H200's gain with and without channels_last;
    the notes' MFU target and the best layer's share of the peak; the CPU layer tables' shares at crop 64 and 32."""
    from utils.flops import PEAK_TFLOPS_TABLE

    chapter = "docs/09-going-further.md"
    h100, h200 = ladder_runs(H100_LADDER), ladder_runs(H200_LADDER)
    peaks = dict(PEAK_TFLOPS_TABLE)
    anchors = quotes.section(chapter, "Where the time goes")
    # The original's A100 SYNTHETIC samples/s, from the chapter's table of its runs.
    a100 = {row: float(re.search(rf"^\| {re.escape(row)} \| ([\d.]+) \|", anchors, flags=re.M).group(1))
            for row in ("DALI, SYNTHETIC (compute alone)", "DALI + AMP fp16 + apex + JIT, SYNTHETIC")}
    tf32, sixteen = h100["gpu-inmem"], h100["gpu-inmem + AMP fp16 + fused Adam"]
    speedups = {f"{tf32['synthetic'] / a100['DALI, SYNTHETIC (compute alone)']:.1f}",
                f"{sixteen['synthetic'] / a100['DALI + AMP fp16 + apex + JIT, SYNTHETIC']:.1f}"}
    assert len(speedups) == 1  # "the step ran 1.6 times faster", in either precision
    ratio = {f"{peaks['H100'][precision] / peaks['A100'][precision]:.1f}" for precision in ("tf32", "bf16")}
    assert len(ratio) == 1  # "the H100's peaks are 3.2 times the A100's", in either precision
    quotes.assert_quoted(anchors, f"{tf32['mfu']['synthetic']:.3f}", f"{sixteen['mfu']['synthetic']:.3f}",
                         *ratio, f"{3.35 / 1.555:.2f}", *speedups)  # HBM: 3.35 TB/s against 1555 GB/s (datasheets)

    gains = [100 * (h200[rung]["full"] / h100[rung]["full"] - 1)
             for rung in ("+ channels_last (bf16, fused)", "+ fused Adam (bf16)")]
    with open(os.path.join(ROOT, "benchmarks", "results", "layers",
                           "nvidia-h100-80gb-hbm3-2026-11-25-bf16.json")) as f:
        best = max(json.load(f)["layers"], key=lambda layer: layer["tflops"])
    with open(os.path.join(ROOT, "benchmarks", "results", "README.md")) as f:
        target = re.search(r"FULL MFU \| at least ([\d.]+) on an H100", f.read()).group(1)
    quotes.assert_quoted(quotes.section(chapter, "The ladder on an H200"), *(f"{gain:.1f}" for gain in gains),
                         target, f"{best['tflops']:.0f}", f"{best['tflops'] / peaks['H100']['bf16']:.2f}")

    def layers_of(suffix):
        with open(os.path.join(ROOT, "benchmarks", "results", "layers",
                               f"cpu-vm-2-cores-2026-11-27-fp32{suffix}.json")) as f:
            report = json.load(f)
        return {layer["layer"]: layer for layer in report["layers"]}, report["total"]["gflop"]

    (crop64, gflop64), (crop32, gflop32) = layers_of("-5"), layers_of("-4")
    quotes.assert_quoted(anchors, f"{100 * crop64['last']['share_of_step']:.1f}",
                         f"{100 * crop64['last']['gflop'] / gflop64:.1f}", f"{crop64['last']['tflops']:.2f}",
                         f"{crop64['up 1']['tflops']:.2f}", f"{100 * crop32['last']['share_of_step']:.1f}",
                         f"{100 * crop32['last']['gflop'] / gflop32:.1f}",
                         f"{100 * crop32['down 5']['share_of_step']:.1f}")
    assert crop32["down 5"]["gflop"] / gflop32 < 0.01  # "for under 1%"


def test_the_padding_share_of_the_counted_flops_is_counted():
    """docs/09's share of the full-scale U-Net's counted FLOPs that touch zero padding at 64^3: each layer's
    FLOPs from torch's FLOP counter, times the share of its (position, tap) pairs that fall on the padding."""
    from torch.utils.flop_counter import FlopCounterMode
    from networks.UNet import UNet

    with torch.device("meta"):
        model, inputs = UNet(4, 5, 64, True), torch.empty(1, 4, 64, 64, 64)
    sides = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Conv3d, torch.nn.ConvTranspose3d)):
            # the layer's larger side: a convolution's input, a transposed convolution's output
            module.register_forward_hook(lambda m, i, o, name=name: sides.__setitem__(name, max(i[0].shape[-1],
                                                                                                  o.shape[-1])))
    counter = FlopCounterMode(display=False, depth=None)
    with counter:
        model(inputs).sum().backward()
    counts = counter.get_flop_counts()
    total = counter.get_total_flops()
    # Along an axis of side n, kernel 4, stride 2, padding 1: 2 of the 2n (position, tap) pairs fall on the padding.
    padded = sum(sum(counts[f"UNet.{name}"].values()) * (1 - (1 - 1 / n) ** 3) for name, n in sides.items())
    import quotes
    quotes.assert_quoted(quotes.section("docs/09-going-further.md", "Where the time goes, layer by layer"),
                         f"{padded / 1e9:.2f}", f"{total / 1e9:.2f}", f"{100 * padded / total:.1f}")


TRACKS = ("## CPU track", "## GPU/cluster track", "## After the session")
MIN_STEPS = {"## CPU track": 6, "## GPU/cluster track": 8, "## After the session": 3}


def track_rows(heading):
    _, rows = table_rows(section(heading))
    return list(rows.values())


def test_the_tracks_run_the_chapters_commands_and_quote_their_numbers():
    """Each step of the hub's tracks (and of the steps after the session): its commands are commands of the
    tutorial's code blocks (so they are run here or listed with a reason), and every number it gives to compare
    (a decimal, a percentage, three digits or more) is written in the hub outside the tracks, in the chapter the
    step links, or in the results file it links (benchmarks/results/)."""
    hub = README
    for heading in TRACKS:
        hub = hub.replace(section(heading), "")
    for heading in TRACKS:
        rows = track_rows(heading)
        assert len(rows) >= MIN_STEPS[heading], heading
        for row in rows:
            commands = re.findall(r"`([^`]+)`", row["command"])
            assert commands and all(c in COMMANDS for c in commands), (heading, commands)
            links = [resolve("README.md", t) for t in relative_targets(" ".join(row.values()))]
            results = [quotes.read(path) for path in links if path.startswith("benchmarks/results/")]
            where = " ".join(text for text in [hub, *(FILES[path] for path in links if path in FILES), *results])
            for number, percent in re.findall(rf"({quotes.NUMBER.pattern})(%?)", row["the number to compare"]):
                if percent:  # a percentage is compared with the percentages written there
                    quotes.assert_quoted(" ".join(re.findall(rf"{quotes.NUMBER.pattern}(?=%)", where)), number)
                elif "." in number or len(number) >= 3:
                    quotes.assert_quoted(where, number)


def test_large_batch_table_is_that_of_the_example_logs():
    """The README's large-batch table: each run's batch, epochs, steps and final loss, from its committed logs."""
    text = section("### Large-batch convergence")
    _, rows = table_rows(text[text.index("| run |") - 1:])
    runs = {"`demo`": "example_logs/demo", "`demo_bs32_test`": "example_logs/large_batch/demo_bs32_test",
            "`demo_bs32_opt`": "example_logs/large_batch/demo_bs32_opt"}
    assert set(rows) == set(runs)
    for name, folder in runs.items():
        with open(os.path.join(ROOT, folder, "config.yaml")) as f:
            config = yaml.safe_load(f)
        with open(os.path.join(ROOT, folder, "out.log")) as f:
            log = f.read()
        steps = config["num_epochs"] * config["Nsamples"] // config["global_batch_size"]
        final = re.findall(r"Avg val loss=([\d.]+)", log)[-1]
        assert [rows[name][column] for column in ("batch", "epochs", "optimiser steps",
                                                  "validation loss at the end")] == \
            [str(config["global_batch_size"]), str(config["num_epochs"]), str(steps), final], name


def test_large_batch_reading_quotes_the_example_logs():
    """The numbers docs/04 reads off the large-batch runs: the validation losses after 64 and 128 steps and
    at the end, to four places, and the last step's learning rate as a share of the peak, from their logs."""
    import quotes
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = quotes.section("docs/04-distributed.md", "Large-batch convergence")
    losses = {}  # {run: {optimiser step: validation loss}}, the step-0 pass first
    for name, folder in {"demo": "example_logs/demo", "test": "example_logs/large_batch/demo_bs32_test",
                         "opt": "example_logs/large_batch/demo_bs32_opt"}.items():
        with open(os.path.join(ROOT, folder, "config.yaml")) as f:
            config = yaml.safe_load(f)
        with open(os.path.join(ROOT, folder, "out.log")) as f:
            found = [float(loss) for loss in re.findall(r"Avg val loss=([\d.]+)", f.read())]
        per_epoch = config["Nsamples"] // config["global_batch_size"]
        losses[name] = {epoch * per_epoch: loss for epoch, loss in enumerate(found)}
    quotes.assert_quoted(text, *(f"{loss:.4f}" for loss in (
        losses["opt"][64], losses["demo"][64],  # step for step, the large batch ahead at first
        losses["test"][64], losses["opt"][128], losses["demo"][128],  # the stall, the end level with the demo
        losses["demo"][256])))  # the demo's final loss
    events = EventAccumulator(os.path.join(ROOT, "example_logs/large_batch/demo_bs32_test/logs"))
    events.Reload()
    rates = [scalar.value for scalar in events.Scalars("Learning Rate")]
    quotes.assert_quoted(text, f"{100 * rates[-1] / max(rates):.0f}")


def test_the_distributed_readings_quote_their_runs():
    """docs/04 reads two results whose table cells do not say it all. The H200's one-GPU point: how far DDP came
    out ahead of no communication, the widest spread of either run's trials (which its cell rounds to 0%), and the
    ladder's rung on the same H200. The original's 4-GPU runs with and without --disable_broadcast_buffers
    (benchmarks/scaling_model.py's RUNS_16, from its README): each epoch's rate, the baseline's own spread
    between its epochs, and the flag's lead over the baseline's faster epoch."""
    from benchmarks import plot_scaling
    from benchmarks.scaling_model import RUNS_16
    from utils import noise

    scaling = quotes.section("docs/04-distributed.md", "Weak and strong scaling")
    folder = os.path.join(ROOT, "benchmarks/results/scaling/nvidia-h200-2026-11-26")
    _, ddp, noddp = plot_scaling.read_folder(folder)
    trials = plot_scaling.folder_trials(folder)
    widest = max(noise.spread(sum(trials[mode][1], [])) for mode in ("ddp", "noddp"))
    _, ladder = results_table("benchmarks/results/nvidia-h200-2026-11-26.md")
    quotes.assert_quoted(quotes.prose(scaling), f"{100 * (ddp[1] / noddp[1] - 1):.1f}", f"{100 * widest:.2f}",
                         ladder["gpu-inmem + AMP fp16 + fused Adam"]["FULL"])  # the table: test_quoted_benchmark_numbers_...

    options = quotes.prose(quotes.section("docs/04-distributed.md", "Adjusting the DDP options"))
    four = {run["broadcast_buffers"]: run["epochs"] for run in RUNS_16
            if run["gpus"] == 4 and run["bucket_cap_mb"] == 25}
    baseline, flag = four[True], four[False]
    quotes.assert_quoted(options, *(f"{rate:.0f}" for rate in (*baseline, *flag)),
                         f"{100 * (max(baseline) / min(baseline) - 1):.0f}",
                         f"{100 * (min(flag) / max(baseline) - 1):.1f}")


# ----------------------------------------------------------------------------- the commands not run here

SLURM = ("needs a Slurm cluster with GPU nodes (Perlmutter); submit_pm.sh itself is submitted to a real "
         "two-node Slurm by tests/test_slurm.py")
# (regular expression matched against the whole command, reason)
NOT_RUN = [
    (r"make demo", "tests/test_demo.py runs the demo's training end to end; here it would also build .venv"),
    (r"make test(-fast)?", "the test suite itself (make test-fast: its core)"),
    (r"source \.venv/bin/activate", "the tests run in the virtual environment already (their python first on PATH); "
                                    "tests/test_env_check.py runs train.py in a Python without its packages"),
    (r"(docker|podman) build .*", "needs a Docker or Podman engine (podman run fails on this machine); "
                                  "tests/test_docker.py builds docker/Dockerfile with buildah and runs the image"),
    (r"podman-hpc build .*", "needs Perlmutter's podman-hpc; tests/test_docker.py builds docker/Dockerfile with "
                             "buildah and runs the image"),
    (r"torchrun --standalone --nproc_per_node=4 -m benchmarks\.allreduce --out network-1-node\.json",
     "needs four GPUs (NCCL); the same sweep runs here on two gloo ranks (the CPU command), and "
     "tests/test_slurm.py submits tests/slurm/allreduce.sh to its two-node cluster"),
    (r"(\w+=\S*\s+)*sbatch .*", SLURM),
    (r"for .*; do .*sbatch .*; done", SLURM),
    (r"\.venv/bin/pip install -r requirements-dali\.txt",
     "downloads about 1 GB; make test installs DALI (requirements-test.txt) and tests/test_data_loader_dali.py "
     "runs the DALI loader in its CPU mode"),
    (r"torchrun --nproc_per_node=4 train\.py --config=bs256_opt .*", "needs four GPUs"),
    (r"nsys profile .*", "needs Nsight Systems and a GPU; tests/test_profiling.py checks the NVTX ranges and "
                         "the profiler window"),
    (r"python -m benchmarks\.ladder", "the GPU preset needs a GPU (it refuses to run on a CPU)"),
    (r"python -m benchmarks\.layers", "the GPU preset needs a GPU (it refuses to run on a CPU)"),
    (r"python -m benchmarks\.profiles", "the GPU preset needs a GPU (it refuses to run on a CPU)"),
    (r"python -m benchmarks\.precision", "the GPU preset needs a GPU (it refuses to run on a CPU)"),
    (r"python -m benchmarks\.scaling", "the GPU preset needs a GPU (it refuses to run on a CPU)"),
    (r"python train_graph\.py .*", "needs a CUDA GPU (CUDA graphs); tests/test_train_graph.py compares graph and "
                                    "eager runs on a GPU and checks the refusal on a CPU"),
    (r"salloc .*", "needs a Slurm allocation of GPU nodes; tests/test_slurm.py runs srun under a real Slurm"),
    (r"export MASTER_ADDR=.*", "only inside a Slurm allocation (reads SLURM_JOB_NODELIST)"),
    (r"export SRUN_CPUS_PER_TASK=.*", "only inside a Slurm allocation of GPU nodes (sets what the srun after it "
                                      "uses; submit_pm.sh sets the same and tests/test_slurm.py runs it)"),
    (r"srun .*", "needs a Slurm allocation of GPU nodes; tests/test_slurm.py runs srun under a real Slurm"),
]

# ----------------------------------------------------------------------------- the commands run here

# A few steps of a few crops: seconds per run. The preview image and physics metrics (matplotlib) and the
# checkpoint (48 MB for the demo model) are skipped except where a test needs them. --device=cpu keeps
# the runs CPU runs on a GPU machine too.
TINY = ("--Nsamples=16 --Nsamples_val=8 --num_epochs=1 --device=cpu --preview_image=false --val_metrics=false "
        "--checkpoint=false")
# The domain_demo's 128^3 crops in two steps of one sample each, on the synthetic loader's noise instead
# of data_large/'s 256^3 box (tests/test_demo.py trains it on the learnable data).
DOMAIN_TINY = ("--Nsamples=4 --Nsamples_val=2 --num_epochs=1 --device=cpu --preview_image=false --val_metrics=false "
               "--checkpoint=false --data_loader_config=synthetic")
# The full-width, full-scale configs (base, short) shrunk to what a 2-core CPU trains in a second.
SMALL_MODEL = "--crop_size=32 --base_channels=4 --global_batch_size=4 --full_scale=false"
# benchy_config.yaml with 2 batches, 1 warm-up and 1 timed trial per kind: the trials take 4 epochs.
TINY_TRIALS = {"nbatches": 2, "ntrials": 1, "nwarmup": 1}


@dataclass
class Run:
    """How a README command is run: ``append`` goes at its end, ``env`` into its environment
    (``{scratch}`` is the scratch directory), ``before`` are command lines run first (not README
    commands: the state the command expects that the README makes with commands not run here), and
    ``check(made)`` asserts on what it made (a Made). ``xfail``: a known code bug. ``marks``: pytest
    marks, e.g. a skip without an optional package (the command is then not run in the reading either)."""
    append: str = ""
    env: dict = field(default_factory=dict)
    before: tuple = ()
    check: Optional[Callable] = None
    xfail: str = ""
    marks: tuple = ()


def file_times(scratch):
    """{path relative to scratch: modification time} of the files in the scratch copy (links not followed)."""
    files = {}
    for folder, _, names in os.walk(scratch):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                files[os.path.relpath(path, scratch)] = os.stat(path).st_mtime_ns
    return files


@dataclass
class Made:
    """What one command left: the scratch copy, its output, and the files it made or changed."""
    scratch: str
    output: str
    new: set

    def path(self, *parts):
        return os.path.join(self.scratch, *parts)

    def one(self, pattern):
        """The one file matching the glob ``pattern`` (relative) that this command made or changed."""
        matches = [p for p in sorted(self.new) if fnmatch.fnmatchcase(p, pattern)]
        assert len(matches) == 1, f"files made matching {pattern}: {matches}"
        return self.path(matches[0])

    def run(self, config, devices="1CPU", run_num=None):
        """The run directory of the run this command finished (its log ends with "Done."): the one
        under runs/<config>/<devices>/ whose log it wrote, or ``run_num``'s."""
        if run_num is None:
            log = self.one(f"runs/{config}/{devices}/*/out.log")
        else:
            log = self.path("runs", config, devices, run_num, "out.log")
            assert os.path.isfile(log), f"no run in {os.path.dirname(log)}; files made: {sorted(self.new)[:20]}"
        with open(log) as f:
            assert "Done. TensorBoard logs" in f.read(), f"the run in {os.path.dirname(log)} did not finish"
        return os.path.dirname(log)


def resolved_config(path):
    with open(os.path.join(path, "config.yaml")) as f:
        return yaml.safe_load(f)


def check_generated(side_train, side_valid, folder="data"):
    """The data set with its .npy copies, made by this command, or found there already (the generator
    after `make data` says so and writes nothing)."""
    def check(made):
        found = made.output.startswith(f"{folder} already holds this data set")
        one = (lambda name: made.path(name)) if found else made.one
        for name, side in (("synthetic_train", side_train), ("synthetic_valid", side_valid)):
            with h5py.File(one(f"{folder}/{name}.h5")) as f:
                assert f["Nbody"].shape == (4, side, side, side) and f["Hydro"].shape == (5, side, side, side)
            assert os.path.isfile(one(f"{folder}/{name}_data.npy"))
    return check


def check_npy(made):
    """Rewritten over the copies the generator made (hence --force), channel last."""
    data = np.load(made.one("data/synthetic_train_data.npy"), mmap_mode="r")
    label = np.load(made.one("data/synthetic_train_label.npy"), mmap_mode="r")
    with h5py.File(made.path("data", "synthetic_train.h5")) as f:
        side = f["Nbody"].shape[1:]
    assert data.shape == (*side, 4) and label.shape == (*side, 5)


def check_run(config, devices="1CPU", run_num=None, **expected):
    def check(made):
        resolved = resolved_config(made.run(config, devices, run_num))
        for key, value in expected.items():
            assert resolved[key] == value, (key, resolved[key])
    return check


def check_preview(made):
    path = made.run("demo")
    assert open(os.path.join(path, "preview.png"), "rb").read(4) == b"\x89PNG"
    assert glob.glob(os.path.join(path, "logs", "events.out.tfevents.*"))


def check_real_paths(made):
    resolved = resolved_config(made.run("demo"))
    assert resolved["train_path"] == made.path("real", "downsamp_2048crop_train.h5")
    assert resolved["val_path"] == made.path("real", "downsamp_1024crop_valid.h5")


def check_resumed(made):
    made.run("demo", run_num="two")
    output = made.output
    assert "Resumed from" in output and "Time taken for epoch 2 " in output and "Time taken for epoch 1 " not in output


def check_complete(made):
    made.run("demo", run_num="two")
    assert "The run in runs/demo/1CPU/two is already complete: it trained 1 epochs" in made.output, made.output[-3000:]


def check_trace(made):
    assert glob.glob(os.path.join(made.run("short"), "profile", "*.pt.trace.json"))


def check_snapshot_message(made):
    made.run("short")
    assert "CUDA memory snapshots need a GPU" in made.output


def check_benchy(config):
    def check(made):
        for kind in ("IO", "SYNTHETIC", "FULL"):
            assert re.search(rf"BENCHY::SUMMARY::\s*{kind} average trial throughput: [\d.]+ \+/- [\d.]+",
                             made.output), kind
        with open(os.path.join(made.run(config), "benchy_output.json")) as f:
            assert json.load(f)["FULL"]["trial_throughput"]
    return check


def check_ladder(made):
    with open(made.one("runs/benchmarks/ladder/*.json")) as f:
        report = json.load(f)
    assert report["command"] == "python -m benchmarks.ladder --preset cpu --nbatches 2 --ntrials 1 --nwarmup 1"
    assert report["runs"] and all("error" not in run and run["full"] > 0 for run in report["runs"]), report["runs"]


def check_layers(made):
    with open(made.one("layers_out/*-fp32.json")) as f:
        report = json.load(f)
    assert len(report["layers"]) == 10 and report["total"]["gflop"] == pytest.approx(report["total"]["model_gflop"])
    assert "The layers' FLOPs add up to the model's" in made.output


def check_flop_table(made):
    output = made.output
    assert "| up 1 | 256 -> 64 | 16 -> 32 | 25.77 | 32.0% |" in output
    assert "Transposed convolutions: 68.2% of the FLOPs; all convolutions: 80.46 GFLOP per sample." in output


def check_memory_budget(made):
    output = made.output
    assert "Per-GPU memory budget: config bs64_opt, 1 rank(s), local batch 64" in output
    assert "On a 40 GiB GPU: fits" in output and "Host memory of --data_loader_config=inmem: 43.5 GB" in output


def check_precision(made):
    with open(made.one("precision_out/*.json")) as f:
        report = json.load(f)
    assert [rung["name"] for rung in report["rungs"]] == ["fp32", "bf16", "fp16"]
    assert "| fp16 |" in made.output


def check_profiles(made):
    with open(made.one("profiles_out/profiles.json")) as f:
        [entry] = json.load(f)["profiles"]
    assert "error" not in entry and entry["phase_ms_per_step"]["forward"] > 0, entry
    made.one(f"profiles_out/{entry['file']}")


def check_scaling(made):
    path = made.one("runs/benchmarks/scaling/*/scaling.json")
    with open(path) as f:
        index = json.load(f)
    assert [(p["mode"], p["ranks"]) for p in index["points"]] == [("ddp", 1), ("noddp", 1)]
    assert all("file" in p for p in index["points"]), index["points"]
    assert "| 1 | " in open(os.path.join(os.path.dirname(path), "README.md")).read()


def check_ddp_options(options, folder_suffix):
    def check(made):
        with open(made.one(f"runs/benchmarks/scaling/*-{folder_suffix}/scaling.json")) as f:
            index = json.load(f)
        assert index["ddp_options"] == options and all("file" in p for p in index["points"]), index["points"]
        ddp, noddp = index["points"]
        assert options in ddp["command"] and "--noddp" in noddp["command"] and options not in noddp["command"]
    return check


def check_strong_scaling(made):
    with open(made.one("runs/benchmarks/scaling/*-strong-16-*/scaling.json")) as f:
        index = json.load(f)
    assert index["global_batch"] == 16 and all("file" in p for p in index["points"]), index["points"]
    assert ["--local_batch_size=16" in p["command"] for p in index["points"]] == [True, True, False, False]
    assert all("--local_batch_size=8" in p["command"] for p in index["points"][2:])


def check_help(made):
    assert made.output.startswith("usage: python train.py") and "  --num_epochs=INT" in made.output
    assert not made.new, made.new  # --help trains nothing, writes nothing


def check_png(name):
    def check(made):
        assert open(made.one(name), "rb").read(4) == b"\x89PNG"
    return check


def check_output(text):
    def check(made):
        assert text in made.output, made.output[-3000:]
    return check


def check_network(name):
    """The all-reduce sweep's profile, with the keys benchmarks.scaling_model reads."""
    def check(made):
        from benchmarks import allreduce

        with open(made.one(name)) as f:
            profile = allreduce.check_profile(json.load(f))
        assert (profile["backend"], profile["world_size"]) == ("gloo", 2) and f"# wrote {name}" in made.output
    return check


def benchy_run(name, *extra):
    """A one-rank benchy run that writes scaling/<name>.json: the kind of file the sbatch loop makes."""
    return (f"BENCHY_OUTPUT=scaling/{name} python train.py --config=test --run_num={name} --enable_benchy "
            f"--num_epochs=4 {' '.join(extra)}")


# Where neither an nsys nor the means to fetch Debian's is at hand, the Nsight Systems commands are skipped.
NSYS_MARKS = (pytest.mark.skipif(
    nsight.find_nsys() is None and not (shutil.which("apt-get") and shutil.which("dpkg-deb")),
    reason="no nsys, and no apt-get and dpkg-deb to fetch Debian's (python -m benchmarks.nsight install)"),)


def check_nsys_installed(made):
    nsys = made.output.strip().splitlines()[-1]
    assert os.access(nsys, os.X_OK) and nsys.endswith("/nsys"), made.output[-2000:]


def check_nsys_profiles(made):
    with open(made.one("nsys_out/profiles.json")) as f:
        [entry] = json.load(f)["profiles"]
    assert entry["nsys"]["file"] == "baseline.nsys-rep" and entry["nsys"]["tables"]["osrt"], entry["nsys"]
    assert os.path.getsize(made.one("nsys_out/baseline.nsys-rep")) > 10_000


def check_domain(made):
    output = made.output
    with open(made.one("domain_out/domain.json")) as f:
        rows = json.load(f)["rows"]
    assert [(row["crop"], row["ranks"]) for row in rows] == [(128, 1), (128, 2)]
    assert all(row["saved_bytes"] == row["predicted_saved_bytes"] for row in rows), rows
    assert rows[1]["halo_bytes"] == rows[1]["predicted_halo_bytes"] > 0
    assert rows[1]["halo_bytes_busiest"] == rows[1]["predicted_halo_busiest"] == rows[1]["halo_bytes"] // 2
    assert "| halo, all ranks (MiB) |" in output and "| halo, busiest rank (MiB) |" in output


# The README command, exactly as extracted (one line, single spaces), and how it is run.
RUN = {
    "make data": Run(check=check_generated(128, 64)),
    # As written: the sizes of `make data`, which it follows (over that data set).
    "python -m utils.generate_data --out_dir data": Run(check=check_generated(128, 64)),
    # Smaller boxes than the README's, to stay quick.
    "python -m utils.generate_data --train_size 256 --val_size 128 --out_dir data_large": Run(
        append="--train_size 32 --val_size 16", check=check_generated(32, 16, folder="data_large")),
    # Over the .npy copies the generator made (hence the README's --force).
    "python -m utils.convert_h5_to_npy -i data/synthetic_train.h5 -d Nbody -l Hydro --force": Run(check=check_npy),
    "python train.py --config=short --help": Run(check=check_help),
    "python train.py --config=short --num_epochs 4 --num_data_workers 8": Run(
        append=f"{SMALL_MODEL} {TINY}", check=check_run("short", num_data_workers=8)),
    "python train.py --config=demo --crop_size=64 --full_scale --start_lr=1e-3 --num_epochs=1 --run_num=crop64": Run(
        append=f"{TINY} --Nsamples=8",
        check=check_run("demo", run_num="crop64", crop_size=64, full_scale=True, start_lr=1e-3)),
    "python train.py --config=demo": Run(
        append=TINY.replace(" --preview_image=false", ""), check=check_preview),
    "python train.py --config=short --num_epochs 4": Run(append=f"{SMALL_MODEL} {TINY}", check=check_run("short")),
    "python train.py --config=demo --train_path=$DATA_DIR/downsamp_2048crop_train.h5 "
    "--val_path=$DATA_DIR/downsamp_1024crop_valid.h5": Run(
        append=TINY, env={"DATA_DIR": "{scratch}/real"}, check=check_real_paths),
    "python train.py --config=demo --run_num=two --num_epochs=2": Run(
        append=f"{TINY} --checkpoint=true", check=check_run("demo", run_num="two")),
    # After the one-epoch run above under the same run name (TINY's sizes: 1 epoch for the README's 2):
    # --resume alone keeps its one epoch (complete); with --allow_changes=num_epochs it continues to epoch 2
    # (2 epochs for the README's 4).
    "python train.py --config=demo --run_num=two --resume": Run(
        append=f"{TINY} --checkpoint=true", check=check_complete),
    "python train.py --config=demo --run_num=two --resume --num_epochs=4 --allow_changes=num_epochs": Run(
        append=f"{TINY} --num_epochs=2 --checkpoint=true", check=check_resumed),
    "python train.py --config=short --num_epochs 4 --profiler=torch": Run(
        append=f"{SMALL_MODEL} {TINY} --profile_start_epoch=1 --profile_steps=2", check=check_trace),
    "python train.py --config=short --num_epochs 1 --memory_snapshot": Run(
        append=f"{SMALL_MODEL} {TINY}", check=check_snapshot_message),
    # benchy ends the run itself when its (tiny) trials are done: the README's 15 epochs stay.
    "python train.py --config=short --num_epochs 15 --enable_benchy": Run(
        append=f"{SMALL_MODEL} {TINY.replace(' --num_epochs=1', '')}",
        env={"BENCHY_CONFIG_FILE": "{scratch}/benchy.yaml"}, check=check_benchy("short")),
    "python train.py --config=demo --num_epochs 15 --enable_benchy": Run(
        append=TINY.replace(" --num_epochs=1", ""),
        env={"BENCHY_CONFIG_FILE": "{scratch}/benchy.yaml"}, check=check_benchy("demo")),
    "python -m benchmarks.ladder --preset cpu": Run(append="--nbatches 2 --ntrials 1 --nwarmup 1", check=check_ladder),
    "python -m benchmarks.layers --preset cpu": Run(append="--repeats 1 --out_dir layers_out", check=check_layers),
    # Calculations from the model's shapes: nothing is trained, so they run as written.
    "python -m benchmarks.layers --flops --amp_mode=bf16": Run(check=check_flop_table),
    # Reads a committed H100 trace: runs as written.
    "python -m benchmarks.in_step sample_nsys_profiles/gpu_inmem_bf16_fused_jit.pt.trace.json.gz": Run(
        check=check_output("| convolutions | 24.43 | 54.1% |")),
    "python -m benchmarks.memory_budget --config=bs64_opt --gpu_memory_gib=40": Run(check=check_memory_budget),
    # One epoch of 16 crops per rung on a narrower model, written into the scratch folder.
    "python -m benchmarks.precision --preset cpu": Run(
        append="--num_epochs 1 --Nsamples=16 --Nsamples_val=8 --base_channels=4 --data_dir data --out_dir precision_out",
        check=check_precision),
    # One rung, two steps, written into the scratch folder (the default folder, example_logs/, is linked here).
    "python -m benchmarks.profiles --preset cpu": Run(
        append="--only gpu_inmem --steps 2 --data_dir data --out_dir profiles_out", check=check_profiles),
    # One rank (the scaling test, tests/test_plot_scaling.py, runs two), a narrower model, tiny trials.
    "python -m benchmarks.scaling --preset cpu --ranks 1 2": Run(
        append="--ranks 1 --nbatches 2 --ntrials 1 --nwarmup 1 --extra=--base_channels=4", check=check_scaling),
    "python -m benchmarks.scaling --preset cpu --ranks 1 2 --global_batch_size=16": Run(
        append="--nbatches 2 --ntrials 1 --nwarmup 1 --extra=--base_channels=4", check=check_strong_scaling),
    # Batch 32 needs more than TINY's 16 crops per epoch.
    "python train.py --config=demo_bs32_test": Run(
        append=f"{TINY} --Nsamples=64", check=check_run("demo_bs32_test", global_batch_size=32, lr_scaling="sqrt")),
    "python train.py --config=demo_bs32_test --grad_accum_steps=4": Run(
        append=f"{TINY} --Nsamples=64", check=check_run("demo_bs32_test", global_batch_size=32, grad_accum_steps=4)),
    "python train.py --config=demo_bs32_opt": Run(
        append=f"{TINY} --Nsamples=64", check=check_run("demo_bs32_opt", global_batch_size=32, Nsamples=64)),
    'python -m benchmarks.scaling --preset cpu --ranks 2 --ddp_options="--bucket_cap_mb=100 '
    '--disable_broadcast_buffers"': Run(
        append="--nbatches 2 --ntrials 1 --nwarmup 1 --extra=--base_channels=4",
        check=check_ddp_options("--bucket_cap_mb=100 --disable_broadcast_buffers",
                                "base-channels-4-bucket-cap-mb-100-disable-broadcast-buffers")),
    'python -m benchmarks.scaling --preset cpu --ranks 2 --ddp_options="--ddp_comm_hook=bf16"': Run(
        append="--nbatches 2 --ntrials 1 --nwarmup 1 --extra=--base_channels=4",
        check=check_ddp_options("--ddp_comm_hook=bf16", "base-channels-4-ddp-comm-hook-bf16")),
    "torchrun --nproc_per_node=2 train.py --config=demo --device=cpu": Run(
        append=TINY, check=check_run("demo", devices="2CPU", world_size=2)),
    "torchrun --standalone --nproc_per_node=2 train.py --config=demo --device=cpu --local_batch_size=8 "
    "--lr_scaling=sqrt --warmup_steps=32 --bucket_cap_mb=100 --ddp_comm_hook=bf16": Run(
        append=TINY, check=check_run("demo", devices="2CPU", global_batch_size=16, warmup_steps=32,
                                     ddp_comm_hook="bf16")),
    # Debian's Nsight Systems, unpacked where tests/test_nsight.py finds it (about 170 MB, fetched once).
    "python -m benchmarks.nsight install": Run(check=check_nsys_installed, marks=NSYS_MARKS),
    "python -m benchmarks.profiles --preset cpu --nsys": Run(
        append="--only baseline --steps 2 --data_dir data --out_dir nsys_out", check=check_nsys_profiles,
        marks=NSYS_MARKS),
    "python -m benchmarks.nsight summary sample_nsys_profiles/cpu/baseline.nsys-rep": Run(
        check=check_output("OS runtime calls by time:"), marks=NSYS_MARKS),
    "python -m benchmarks.scaling_model --check": Run(check=check_output("\nverdict on the ")),
    "python -m benchmarks.scaling_model --check --json": Run(check=check_output('"nccl": "2.15.5"')),
    "python -m benchmarks.scaling_model --knobs": Run(check=check_output("| --ddp_comm_hook=bf16 |")),
    "python -m benchmarks.scaling_model --machine h100 --local_batch_size=128 --ddp_comm_hook=bf16 --out model.png": Run(
        check=check_png("runs/benchmarks/model.png")),
    "torchrun --standalone --nproc_per_node=2 -m benchmarks.allreduce --min_bytes 4K --max_bytes 64M --out cpu-network.json":
        Run(append="--max_bytes 8K --iters 1 --warmup 0", check=check_network("cpu-network.json")),
    "python -m benchmarks.cudnn_autotune": Run(
        check=check_output("nothing to measure"),
        marks=(pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it measures (the GPU suite runs it)"),)),
    # Domain parallelism: two steps on 128^3 crops (the domain_demo's own size), on two ranks and on one.
    "torchrun --nproc_per_node=2 train.py --config=domain_demo": Run(
        append=DOMAIN_TINY, check=check_run("domain_demo", devices="2CPU", domain_mesh=[2, 1, 1])),
    'python train.py --config=domain_demo "--domain_mesh=[1,1,1]"': Run(
        append=DOMAIN_TINY, check=check_run("domain_demo", domain_mesh=[1, 1, 1])),
    "python -m benchmarks.domain --crops 128 256 --ranks 1 2 4": Run(
        append="--base_channels 4 --crops 128 --ranks 1 2 --out_dir domain_out", check=check_domain),
    # Its inputs come from the sbatch loop above; here from two real one-rank CPU benchy runs.
    "python -m benchmarks.plot_scaling --ddp scaling/ddp_*.json --noddp scaling/noddp_*.json --out scaling/scaling.png":
        Run(before=(benchy_run("ddp_1"), benchy_run("noddp_1", "--noddp")),
            env={"BENCHY_CONFIG_FILE": "{scratch}/benchy.yaml"}, check=check_png("scaling/scaling.png")),
}

# The single-GPU performance section: each step is the short config with a few options, run here shrunk like
# the commands above, and checked for the options it resolved and for an effect of each in the run's output:
# the loader it built, the inputs' dtype, the convolutions' precision and layout, DataLoader's 8 workers, fused
# Adam in the checkpoint's optimizer state, torch.compile's generated kernels. On a CPU --tf32=false and
# --device_prefetch=false change nothing (TF32 and the copy ahead exist on GPUs only): the convolutions stay fp32.
SHORT = "python train.py --config=short --num_epochs 4"


def loader(name):
    return rf"data loader initialized with config {name}\n"


def gpu_inmem(dtype):
    return rf"gpu-inmem: \S+train\.h5 on cpu as {dtype},"


def convolutions(precision, layout="contiguous"):
    return rf"; {precision} convolutions run on .*, layout {layout}\n"


def eight_workers():
    """torch's DataLoader warns that 8 workers exceed the CPUs it can use, where there are fewer than 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [r"This DataLoader will create 8 worker processes in total"] if cpus < 8 else []


def fused_adam(made, config="short"):
    state = torch.load(os.path.join(made.run(config), "checkpoint.pt"), weights_only=False)
    groups = state["optimizer"]["param_groups"]
    assert all(group["fused"] for group in groups), [group["fused"] for group in groups]


def compiled_kernels(made):
    assert glob.glob(made.path("inductor", "**", "*.py"), recursive=True), "torch.compile generated no kernel"


def check_short(expected, effects=(), then=None):
    """check_run's options, each regex of ``effects`` found in the run's output, and ``then(made)``."""
    return check_short_like("short", expected, effects, then)


def check_short_like(config, expected, effects=(), then=None):
    """check_short for another config's run."""
    options = check_run(config, **expected)

    def check(made):
        options(made)
        for effect in effects:
            assert re.search(effect, made.output), (effect, made.output[-3000:])
        if then:
            then(made)
    return check


# options: (resolved options, their effects in the output, a check of the files, appended options, environment)
PERFORMANCE_STEPS = {
    "--num_data_workers 8 --data_loader_config=inmem": (
        {"num_data_workers": 8, "data_loader_config": "inmem"}, [loader("inmem"), *eight_workers()]),
    "--num_data_workers 8 --device_prefetch=false": (
        {"num_data_workers": 8, "device_prefetch": False}, [loader("lowmem"), *eight_workers()]),
    "--data_loader_config=gpu-inmem": ({"data_loader_config": "gpu-inmem"}, [gpu_inmem("float32")]),
    "--data_loader_config=gpu-inmem --gpu_inmem_dtype=float16": ({"gpu_inmem_dtype": "float16"},
                                                                 [gpu_inmem("float16")]),
    "--data_loader_config=gpu-inmem --tf32=false": ({"tf32": False}, [convolutions("fp32")]),
    "--data_loader_config=gpu-inmem --amp_mode=bf16": ({"amp_mode": "bf16"}, [convolutions("bf16")]),
    "--data_loader_config=gpu-inmem --amp_mode=fp16": ({"amp_mode": "fp16"}, [convolutions("fp16")]),
    "--data_loader_config=gpu-inmem --amp_mode=bf16 --channels_last": (
        {"channels_last": True}, [convolutions("bf16", "channels_last_3d")]),
    # --enable_jit scripts the loss function only (utils/losses.py): the run shows no more of it than its option.
    "--data_loader_config=gpu-inmem --amp_mode=bf16 --enable_fused --enable_jit": (
        {"enable_fused": True, "enable_jit": True}, [convolutions("bf16")], fused_adam, "--checkpoint=true"),
    # torch.compile on the CPU: Inductor's C++ kernels, about 20 s of compiling on 2 cores, cached in the copy.
    "--data_loader_config=gpu-inmem --amp_mode=bf16 --enable_fused --jit_mode=compile": (
        {"jit_mode": "compile"}, [convolutions("bf16")], compiled_kernels, "",
        {"TORCHINDUCTOR_CACHE_DIR": "{scratch}/inductor"}),
}


def performance_step(expected, effects, then=None, append="", env=None):
    return Run(append=f"{SMALL_MODEL} {TINY} {append}".rstrip(), env=env or {},
               check=check_short(expected, effects, then))


RUN.update({f"{SHORT} {options}": performance_step(*step) for options, step in PERFORMANCE_STEPS.items()})
RUN.update({
    # On a CPU the variable changes nothing; the run must still work as written.
    f"NVIDIA_TF32_OVERRIDE=0 {SHORT} --data_loader_config=gpu-inmem": performance_step(
        {"data_loader_config": "gpu-inmem"}, [gpu_inmem("float32"), convolutions("fp32")]),
    # DALI's real pipeline in its CPU mode, on the .npy copies of the README's data section.
    f"{SHORT} --num_data_workers 8 --data_loader_config=dali-lowmem": Run(
        append=f"{SMALL_MODEL} {TINY}", check=check_short({"data_loader_config": "dali-lowmem"}, [loader("dali-lowmem")]),
        marks=(needs_dali,)),
})

# The demo with one optimisation flag each (chapter 03's CPU lines), each checked for the flag's effect: the
# layout its convolutions run in, fused Adam in the checkpoint, torch.compile's generated kernels.
RUN.update({
    "python train.py --config=demo --channels_last": Run(
        append=TINY, check=check_short_like("demo", {"channels_last": True},
                                            [convolutions("fp32", "channels_last_3d")])),
    "python train.py --config=demo --enable_fused": Run(
        append=f"{TINY} --checkpoint=true",
        check=check_short_like("demo", {"enable_fused": True}, then=lambda made: fused_adam(made, "demo"))),
    "python train.py --config=demo --jit_mode=compile": Run(
        append=TINY, env={"TORCHINDUCTOR_CACHE_DIR": "{scratch}/inductor"},
        check=check_short_like("demo", {"jit_mode": "compile"}, then=compiled_kernels)),
})

COMMANDS = readme_commands(TEXT)  # the hub's, then each chapter's, in reading order


def classify(command):
    """('run', Run) or ('not run', reason) or (None, None)."""
    if command in RUN:
        return "run", RUN[command]
    for pattern, reason in NOT_RUN:
        if re.fullmatch(pattern, command):
            return "not run", reason
    return None, None


def test_every_readme_command_is_classified():
    assert COMMANDS, "the README shows commands in ```bash blocks"
    unclassified = [c for c in COMMANDS if classify(c)[0] is None]
    assert not unclassified, ("README commands that are neither in RUN nor in NOT_RUN of tests/test_readme.py; "
                              f"run them there, or give the reason they cannot run: {unclassified}")
    both = [c for c in COMMANDS if c in RUN and any(re.fullmatch(p, c) for p, _ in NOT_RUN)]
    assert not both, f"in RUN and in NOT_RUN: {both}"
    stale = [c for c in RUN if c not in COMMANDS] + [p for p, _ in NOT_RUN
                                                    if not any(re.fullmatch(p, c) for c in COMMANDS)]
    assert not stale, f"entries of RUN or NOT_RUN that match no README command any more: {stale}"


def test_a_command_new_to_the_readme_is_unclassified_until_listed():
    assert classify("python train.py --config=demo --a_new_option") == (None, None)
    assert classify("BENCHY_OUTPUT=x sbatch -N 4 ./submit_pm.sh --config=bs256_opt")[0] == "not run"


def test_the_extraction_joins_continuations_drops_comments_and_keeps_loops_whole():
    from readme_commands import commands

    block = ("# a comment line\nnsys profile -o x \\\n    python train.py --config=short   # profile it\n"
             "for n in 1 2; do\n    echo $n  # each\n    echo done-ish\ndone\npython -c 'print(\"#\")'\n")
    assert commands(block) == ["nsys profile -o x python train.py --config=short",
                               "for n in 1 2; do echo $n; echo done-ish; done", "python -c 'print(\"#\")'"]


@pytest.fixture(scope="module")
def readme_data(tmp_path_factory):
    """Small real files in the data set's layout: 64^3 boxes, so that a 64^3 crop fits too."""
    directory = tmp_path_factory.mktemp("readme_data")
    paths = {}
    for name, seed in (("train", 1), ("valid", 2)):
        nbody, hydro = generate_box(64, seed)
        paths[name] = str(directory / f"{name}.h5")
        write_h5(paths[name], nbody, hydro, {"seed": seed})
    return paths


# Where the scratch directory holds copies of the small data files, under which names.
DATA_FOLDERS = {
    "data": ("synthetic_train.h5", "synthetic_valid.h5"),                  # the configs' default paths
    "data/benchmark": ("synthetic_train.h5", "synthetic_valid.h5"),        # the benchmarks' default --data_dir
    "real": ("downsamp_2048crop_train.h5", "downsamp_1024crop_valid.h5"),  # $DATA_DIR: the real files' names
}


def write_tiny_benchy_config(path):
    with open(os.path.join(ROOT, "benchy_config.yaml")) as f:
        config = yaml.safe_load(f)
    for kind in ("IO", "synthetic", "full"):
        config[kind].update(TINY_TRIALS)
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


def run_shell(line, scratch, env):
    return subprocess.run(["bash", "-c", line], cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_for(300))


def command_id(command, limit=90):
    """The test id of a command: the command itself, long ones cut in the middle."""
    return command if len(command) <= limit else command[:limit // 2 - 2] + "..." + command[-(limit // 2 - 1):]


def skipped_here(run):
    """The reason a command's marks skip it on this machine, or None."""
    for mark in run.marks:
        if mark.name == "skipif" and mark.args and mark.args[0]:
            return mark.kwargs.get("reason", "skipped")
    return None


@dataclass
class Ran:
    """One command of the reading: its command line, exit status, output, and its check's failure ("" if none)."""
    line: str
    returncode: int
    output: str
    problem: str = ""
    seconds: float = 0.0


@pytest.fixture(scope="module")
def reading(tmp_path_factory, readme_data):
    """A reader who runs the tutorial's commands in reading order (README.md, then the chapters
    docs/01-*.md, docs/02-*.md, ...), in one fresh copy of the repository, CPU-sized as above, the
    state carried from each command to the next: {command: Ran}, each checked right after it ran on
    the files it made or changed. A command that fails does not stop the reading: the later ones
    report for themselves."""
    scratch = make_scratch(tmp_path_factory.mktemp("reading"), ROOT)
    has_venv = os.path.isdir(os.path.join(scratch, ".venv"))
    for folder, (train_name, valid_name) in DATA_FOLDERS.items():
        if folder != "data":  # data/ is made by the README's own first commands
            copy_data([(readme_data["train"], os.path.join(scratch, folder, train_name)),
                       (readme_data["valid"], os.path.join(scratch, folder, valid_name))])
    write_tiny_benchy_config(os.path.join(scratch, "benchy.yaml"))
    # Nothing of the caller's make (its variables travel in MAKEFLAGS), Slurm job or benchy settings.
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("BENCHY_", "SLURM_", "MAKE")) and k not in ("MFLAGS", "DATA_DIR", "TENSORBOARD_LOGDIR")}
    base_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base_env.get("PATH", "")
    ran = {}
    for command in COMMANDS:
        run = RUN.get(command)
        if run is None or skipped_here(run) or (command.startswith("make ") and not has_venv):
            continue
        env = {**base_env, **{key: value.format(scratch=scratch) for key, value in run.env.items()}}
        for line in run.before:
            result = run_shell(shell_line(line), scratch, env)
            if result.returncode != 0:
                ran[command] = Ran(line, result.returncode, result.stdout[-3000:] + result.stderr[-3000:],
                                   "its set-up failed")
                break
        else:
            line = shell_line(command) + (" " + run.append if run.append else "")
            before, started = file_times(scratch), time.monotonic()
            result = run_shell(line, scratch, env)
            output = result.stdout + result.stderr
            after = file_times(scratch)
            ran[command] = Ran(line, result.returncode, output, seconds=time.monotonic() - started)
            if result.returncode == 0 and run.check:
                try:
                    run.check(Made(scratch, output, {p for p, t in after.items() if before.get(p) != t}))
                except AssertionError as error:
                    ran[command].problem = f"{type(error).__name__}: {error}"
    yield ran
    for folder in ("data", "data_large", "real"):  # pytest keeps the last runs' folders: the logs, not the data
        shutil.rmtree(os.path.join(scratch, folder), ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    pytest.param(c, id=command_id(c), marks=[*RUN[c].marks, *([pytest.mark.xfail(strict=True, reason=RUN[c].xfail)]
                                                              if RUN[c].xfail else [])])
    for c in COMMANDS if c in RUN])
def test_readme_command_runs_on_cpu(command, reading):
    """The command, at its place in the reading, exits 0 and makes what it promises."""
    if command.startswith("make ") and command not in reading:
        pytest.skip("make would build a .venv here: run the tests from the repository's virtual environment")
    ran = reading[command]
    earlier = [c for c in reading if c != command and reading[c].returncode != 0][:3]
    assert ran.returncode == 0, f"`{ran.line}` exited with {ran.returncode} (earlier commands that failed: " \
                                f"{earlier}):\n{ran.output[-5000:]}"
    assert not ran.problem, f"`{ran.line}`: {ran.problem}\n{ran.output[-3000:]}"


@pytest.mark.slow
def test_readme_commands_run_in_order_in_one_fresh_copy(reading):
    """Every command run here ran, in reading order, and none exited non-zero: no run directory
    collides with an earlier command's, no tool refuses its documented command because an earlier
    one wrote its results."""
    left_out = [c for c in COMMANDS if c in RUN and c not in reading and not skipped_here(RUN[c])
                and not c.startswith("make ")]
    assert not left_out, f"commands of RUN the reading did not run: {left_out}"
    failed = [c for c, r in reading.items() if r.returncode != 0]
    assert not failed, f"commands that exited non-zero, in order: {failed}"
    slowest = sorted(reading.items(), key=lambda item: -item[1].seconds)[:10]
    print("The reading's slowest commands:", *(f"{r.seconds:6.1f} s  {command_id(c)}" for c, r in slowest), sep="\n")

