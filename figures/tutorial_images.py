"""The tutorial's figures, made from committed results of real runs (`make figures`).

    python -m figures.tutorial_images                      # all figures from example_logs/ into tutorial_images/

- ``demo_loss_curves.png``: train and validation loss of the example demo run, read from its
  TensorBoard event files with TensorBoard's own reader.
- ``large_batch_loss.png``: the validation loss of that run and of the ``demo_bs32_test`` and
  ``demo_bs32_opt`` runs in ``example_logs/large_batch/``, against steps and samples.
- ``demo_preview.png`` and ``demo_power_spectrum.png``: the last preview and power-spectrum images
  that run logged to TensorBoard.
- ``tensorboard_scalars.png``: TensorBoard's scalars page for that run, shot in headless Chromium
  (skipped with a message when Chromium is missing).
- ``ladder_<results file>.png``: FULL, SYNTHETIC and IO samples/s of every rung of each committed
  benchmark result, ``benchmarks/results/*.json`` (written by ``python -m benchmarks.ladder``).
- ``scaling_<folder>.png``: weak- or strong-scaling throughput and communication overhead of each committed
  ``benchmarks/results/scaling/<folder>/`` with two sizes or more (written by ``python -m
  benchmarks.scaling``).
- ``scaling_model.png``: bs64_opt's weak scaling (real and synthetic data) on Perlmutter and DGX H100 nodes as
  ``benchmarks/scaling_model.py`` predicts them.
- ``domain_halo.png``: the blocks of a crop split over ``--domain_mesh=[2,2,1]`` and one rank's halo,
  drawn from the code's own block arithmetic (``utils/distributed.py``) and halo width (``utils/halo.py``).
- ``profile_<folder>_<rung>.png`` (``<folder>``: :func:`profile_tag`): a timeline of two steps of each committed torch profiler trace,
  listed in ``profiles.json`` of ``sample_nsys_profiles/`` and ``example_logs/cpu_profiles/``
  (written by ``python -m benchmarks.profiles``).
- ``nsys_<folder>_<rung>.png``: a timeline of each committed Nsight Systems report listed there, drawn
  from its SQLite export (``nsys export``; not remade where no nsys is found).

Each figure's caption in README.md names the run (command, device, date) that produced the logs.
"""
import argparse
import glob
import gzip
import io
import json
import os
import sys
import textwrap

import numpy as np

from utils.profiling import range_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    if not events.Tags()["scalars"]:
        sys.exit(f"error: no TensorBoard scalars under {log_dir}")
    return events


def loss_curves(events, title, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for tag, style in (("Loss/train", "o-"), ("Loss/valid", "s-")):
        points = events.Scalars(tag)
        ax.plot([p.step for p in points], [p.value for p in points], style, label=tag)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("L1 loss")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def large_batch_curves(runs, path):
    """``Loss/valid`` of several runs against optimiser steps and against samples seen.

    ``runs`` maps a label to a run directory (with logs/ and config.yaml). With one rank per
    demo-sized batch, a step of any of these runs takes about the same time, so steps are the time
    axis of a data-parallel run; on one processor, samples are.
    """
    import yaml

    plt = pyplot()
    fig, (by_step, by_sample) = plt.subplots(1, 2, figsize=(10, 4), dpi=100, sharey=True)
    for label, run_dir in runs.items():
        with open(os.path.join(run_dir, "config.yaml")) as f:
            batch = yaml.safe_load(f)["global_batch_size"]
        points = load_events(os.path.join(run_dir, "logs")).Scalars("Loss/valid")
        steps, losses = [p.step for p in points], [p.value for p in points]
        by_step.plot(steps, losses, "o-", markersize=3, label=f"{label} (batch {batch})")
        by_sample.plot([step * batch for step in steps], losses, "o-", markersize=3)
    from matplotlib.ticker import FuncFormatter

    for ax, xlabel in ((by_step, "optimiser step (time with one rank per 8 samples)"),
                       (by_sample, "samples seen (time on one processor)")):
        ax.set_xlabel(xlabel)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.02, not 2 x 10^-2
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.grid(True, which="both", alpha=0.3)
    by_step.set_ylabel("validation L1 loss")
    by_step.legend(fontsize=8)
    fig.suptitle("large batches on the demo model (2-core CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def last_image(events, tag, path):
    """The last image logged under ``tag``, written as it was logged (PNG bytes)."""
    import matplotlib.image

    encoded = events.Images(tag)[-1].encoded_image_string
    image = matplotlib.image.imread(io.BytesIO(encoded), format="png")
    matplotlib.image.imsave(path, np.asarray(image))


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ladder_chart(report, path):
    """Samples/s of FULL, SYNTHETIC and IO trials for each rung of one benchmark result (log scale:
    on a GPU the loader alone can be many times faster than training)."""
    plt = pyplot()
    # The ladder's order (a run's "step"), top to bottom, whatever order the tool measured them in.
    runs = sorted((run for run in report["runs"] if "error" not in run), key=lambda run: run.get("step", 0))
    fig, ax = plt.subplots(figsize=(8, 1.9 + 0.55 * len(runs)), dpi=100)
    rows = np.arange(len(runs))[::-1]
    height = 0.27
    for offset, (key, label) in zip((height, 0, -height), (("full", "FULL (training)"),
                                                          ("synthetic", "SYNTHETIC (cached batch)"),
                                                          ("io", "IO (loader alone)"))):
        values = [run[key] or 0 for run in runs]
        ax.barh(rows + offset, values, height, label=label)
        for row, value in zip(rows, values):
            ax.text(value, row + offset, f" {value:.0f}", va="center", fontsize=7)
    for row, run in zip(rows, runs):
        mfu = (run.get("mfu") or {}).get("synthetic")
        if mfu is not None:
            ax.text(1.0, row, f"MFU {mfu:.2f} ", transform=ax.get_yaxis_transform(), ha="right", va="center",
                    fontsize=7)
    ax.set_yticks(rows, [run["name"] for run in runs], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s")
    command = "\n".join(textwrap.wrap(report["command"], 110))
    ax.set_title(f"{report['device']}, {report['date'][:10]}\n{command}", fontsize=8)
    largest = max((run[key] or 0 for run in runs for key in ("full", "synthetic", "io")), default=1)
    ax.set_xlim(right=largest * 2.5)  # room for the value labels
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16 - 0.6 / (1 + len(runs))), ncol=3)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


TIMELINE_ROWS = ("step", "data copy in", "forward", "backward", "optimizer")


def launched_kernels(events, start, end):
    """The kernels the host launched between ``start`` and ``end``, wherever the device ran them: a
    kernel's ``correlation`` names the runtime call (cudaLaunchKernel, cudaGraphLaunch, ...) that
    queued it. A CUDA graph's replay is one call of well under a millisecond whose kernels run for tens
    of milliseconds after it. Traces without correlations fall back to the kernels that started in the
    window."""
    launches = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and start <= e["ts"] < end and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if launches:
        return [e for e in kernels if e.get("args", {}).get("correlation") in launches]
    return [e for e in kernels if start <= e["ts"] < end]


def profile_timeline(trace, title, path, steps=2):
    """The first ``steps`` annotated steps of a torch profiler trace: the host's phases, and on a
    GPU the kernels as the device ran them (same clock), so gaps where the device waits show."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    step_events = sorted((e for e in annotations if e["name"].startswith("step ")), key=lambda e: e["ts"])[:steps]
    if not step_events:
        raise ValueError("the trace has no 'step N' ranges (made without train.py's annotate?)")
    start = step_events[0]["ts"]
    end = step_events[-1]["ts"] + step_events[-1]["dur"]
    rows = {name: [] for name in TIMELINE_ROWS}
    rows["loader (next batch)"] = []
    for event in annotations:
        if not start <= event["ts"] < end:
            continue
        name = event["name"]
        base = range_name(name)
        if base in rows:
            rows[base].append(event)
        elif name.startswith("enumerate(DataLoader)") or "data_loader" in name.lower():
            rows["loader (next batch)"].append(event)
    kernels = launched_kernels(events, start, end)
    if kernels:
        rows["GPU kernels"] = kernels
        end = max(end, max(e["ts"] + e["dur"] for e in kernels))  # the device runs behind the host
    spans = {name: [((e["ts"] - start) / 1e3, max(e["dur"], 1) / 1e3) for e in events]
             for name, events in rows.items() if events}  # the trace's clock is in microseconds
    draw_timeline(spans, (end - start) / 1e3, "ms from the start of the first step shown", title, path)


def draw_timeline(rows, length, label, title, path):
    """One row of bars per name, top to bottom: ``rows`` maps a name to its (start, length) spans, in the
    units of the x axis, which runs from 0 to ``length``."""
    plt = pyplot()
    names = list(rows)
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.4), dpi=100)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, name in enumerate(names):
        ax.broken_barh(rows[name], (len(names) - 1 - index - 0.35, 0.7), color=colours[index % len(colours)])
    ax.set_yticks(range(len(names)), names[::-1], fontsize=8)
    ax.set_xlim(0, length)
    ax.set_xlabel(label)
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def tables(database):
    return {name for (name,) in database.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def nsys_rows(database, os_calls=6):
    """The spans (start, end in ns) of an Nsight Systems report's SQLite export, by row: the NVTX ranges
    the training loop annotates (by name), the CUDA kernels, and the OS runtime calls that took the most
    time (by call)."""
    held, rows = tables(database), {}
    if "NVTX_EVENTS" in held:
        for name, start, end in database.execute(
                "SELECT COALESCE(e.text, s.value), e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                "ON e.textId = s.id WHERE e.eventType IN (59, 60) AND e.end IS NOT NULL"):
            if range_name(name or "") in TIMELINE_ROWS:
                rows.setdefault(range_name(name), []).append((start, end, name))
        rows = {name: rows[name] for name in TIMELINE_ROWS if name in rows}
    if "CUPTI_ACTIVITY_KIND_KERNEL" in held:
        rows["GPU kernels"] = [(start, end, None) for start, end in
                               database.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")]
    if "OSRT_API" in held:
        busiest = [name for (name,) in database.execute(
            "SELECT s.value FROM OSRT_API o JOIN StringIds s ON o.nameId = s.id GROUP BY s.value "
            "ORDER BY SUM(o.end - o.start) DESC LIMIT ?", (os_calls,))]
        for name in busiest:
            rows[f"OS: {name}"] = [(start, end, None) for start, end in database.execute(
                "SELECT o.start, o.end FROM OSRT_API o JOIN StringIds s ON o.nameId = s.id WHERE s.value = ?",
                (name,))]
    return {name: spans for name, spans in rows.items() if spans}


def nsys_timeline(database, title, path, steps=2):
    """A timeline of an Nsight Systems report's SQLite export: its first ``steps`` NVTX steps where it has
    them (a GPU report's window), else the whole report (a CPU run's, where nsys records the OS calls)."""
    rows = nsys_rows(database)
    if not rows:
        raise ValueError("the report holds no NVTX ranges, kernels or OS runtime calls")
    step_spans = sorted(rows.get("step", []))[:steps]
    if step_spans:
        start, end = step_spans[0][0], step_spans[-1][1]
        kernels = rows.get("GPU kernels", [])
        end = max([end] + [e for s, e, _ in kernels if start <= s < end])  # the device runs behind the host
    else:
        start = min(s for spans in rows.values() for s, _, _ in spans)
        end = max(e for spans in rows.values() for _, e, _ in spans)
    unit, label = (1e6, "ms from the start of the first step shown") if step_spans else (1e9, "s from the first event")
    spans = {name: [((s - start) / unit, max(e - s, 1) / unit) for s, e, _ in row if e > start and s < end]
             for name, row in rows.items()}  # the report's clock is in nanoseconds
    draw_timeline(spans, (end - start) / unit, label, title, path)


def profile_tag(folder):
    """The images' name for a folder of profiles: its path in the repository, folders joined by "_" and
    example_logs/ left out (sample_nsys_profiles/dali -> sample_nsys_profiles_dali, example_logs/cpu_profiles
    -> cpu_profiles); a folder outside the repository, its own name."""
    relative = os.path.relpath(os.path.abspath(folder), ROOT)
    if relative.startswith(os.pardir):
        return os.path.basename(os.path.normpath(folder))
    parts = relative.split(os.sep)
    return "_".join(parts[1:] if parts[0] == "example_logs" and len(parts) > 1 else parts)


def profile_figures(folder, out_dir):
    """A timeline for each trace and each Nsight Systems report listed in ``folder``/profiles.json; returns
    the images written."""
    tag = profile_tag(folder)
    index_path = os.path.join(folder, "profiles.json")
    if not os.path.exists(index_path):
        return []
    with open(index_path) as f:
        index = json.load(f)
    written = []
    for entry in index["profiles"]:
        if "file" not in entry:
            continue
        with gzip.open(os.path.join(folder, entry["file"])) as f:
            trace = json.load(f)
        name = f"profile_{tag}_{entry['rung']}.png"
        profile_timeline(trace, f"{entry['rung']}: {entry['what']} ({entry['device']}, {entry['date'][:10]})",
                         os.path.join(out_dir, name))
        written.append(name)
    return written


def nsys_figures(folder, out_dir):
    """``nsys_<tag>_<rung>.png`` for each Nsight Systems report listed in ``folder``/profiles.json, from its
    SQLite export (nsys exports it; without an nsys here they are not remade, and a line says so)."""
    import sqlite3
    import tempfile

    from benchmarks import nsight

    tag, index_path = profile_tag(folder), os.path.join(folder, "profiles.json")
    if not os.path.exists(index_path):
        return []
    with open(index_path) as f:
        entries = json.load(f)["profiles"]
    reports = [entry for entry in entries if "file" in entry.get("nsys", {})]
    nsys = nsight.find_nsys() if reports else None
    if reports and nsys is None:
        print(f"nsys not found: the timelines of {tag}'s Nsight Systems reports not remade "
              "(python -m benchmarks.nsight install)")
        return []
    written = []
    for entry in reports:
        name = f"nsys_{tag}_{entry['rung']}.png"
        with tempfile.TemporaryDirectory() as scratch:
            database = sqlite3.connect(nsight.export_sqlite(nsys, os.path.join(folder, entry["nsys"]["file"]),
                                                            os.path.join(scratch, "report.sqlite")))
            nsys_timeline(database, f"{entry['nsys']['file']}: {entry['rung']}, {entry['what']} under Nsight "
                          f"Systems ({entry['device']}, {entry['date'][:10]})", os.path.join(out_dir, name))
            database.close()
        written.append(name)
    return written


def scaling_figures(results, out_dir):
    """A scaling plot for each folder of ``results``/scaling/ (written by benchmarks.scaling)."""
    from benchmarks import plot_scaling

    written = []
    for index_path in sorted(glob.glob(os.path.join(results, "scaling", "*", "scaling.json"))):
        folder = os.path.dirname(index_path)
        index, ddp, noddp = plot_scaling.read_folder(folder)
        if len(set(ddp) | set(noddp)) < 2:  # one size (a DDP knob tried at 2 ranks, say) is a table, not a plot
            continue
        name = f"scaling_{os.path.basename(folder)}.png"
        plot_scaling.plot(ddp, noddp, "FULL", os.path.join(out_dir, name), index["unit"],
                          f"{plot_scaling.batch_description(index)}\n{index['device']}, {index['date'][:10]}")
        written.append((name, folder))
    return written


def domain_figure(path, crop=16, mesh=(2, 2, 1)):
    """One depth-height slice of a ``crop``^3 crop split over ``mesh``: each rank's block (from
    ``DomainMesh.block_in``), and rank 0's halo, the voxels its convolutions read from the neighbours:
    ``HALO`` voxels beyond each face it shares, the depth faces first, then the height faces with the
    depth halo included (which brings the corner voxel of the diagonal neighbour)."""
    from matplotlib.patches import Rectangle

    from utils.distributed import DomainMesh
    from utils.halo import HALO

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5.2), dpi=100)
    colours = ["#8ecae6", "#ffb703", "#90be6d", "#f28482"]
    blocks = []
    for index in range(mesh[0] * mesh[1]):
        block = DomainMesh(shape=mesh, coords=(index // mesh[1], index % mesh[1], 0)).block_in(crop)
        (d0, d1), (h0, h1), _ = block
        blocks.append(block)
        ax.add_patch(Rectangle((h0, d0), h1 - h0, d1 - d0, facecolor=colours[index], edgecolor="black", lw=1.5))
        ax.text((h0 + h1) / 2, (d0 + d1) / 2, f"rank {index}\nblock {d1 - d0} x {h1 - h0} x {crop}",
                ha="center", va="center", fontsize=9)
    (d0, d1), (h0, h1), _ = blocks[0]
    depth_halo = Rectangle((h0, d1), h1 - h0, HALO, fill=False, hatch="///", edgecolor="black", lw=0)
    height_halo = Rectangle((h1, d0), HALO, d1 - d0 + HALO, fill=False, hatch="\\\\\\", edgecolor="black", lw=0)
    for patch in (depth_halo, height_halo):
        ax.add_patch(patch)
    ax.annotate("1: depth halo from rank 2", (h0 + (h1 - h0) / 2, d1 + HALO / 2), (h0 + 0.5, d1 + 6.5),
                arrowprops={"arrowstyle": "->"}, fontsize=9)
    ax.annotate("2: height halo from rank 1\n(its last voxel: rank 3's,\nvia rank 1's depth halo)",
                (h1 + HALO / 2, d0 + (d1 - d0) / 2), (h1 + 2.2, d0 + 1.5), arrowprops={"arrowstyle": "->"}, fontsize=9)
    for t in range(crop + 1):  # the voxel grid
        ax.plot([0, crop], [t, t], color="white", lw=0.3)
        ax.plot([t, t], [0, crop], color="white", lw=0.3)
    ax.set_xlim(0, crop)
    ax.set_ylim(crop, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("height (voxels)")
    ax.set_ylabel("depth (voxels)")
    ax.set_title(f"--domain_mesh={list(mesh)}: a {crop}^3 crop, one depth-height slice;\n"
                 f"hatched: rank 0's halo before each convolution", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Make the tutorial's figures from example_logs/.")
    parser.add_argument("--run", default=os.path.join(ROOT, "example_logs", "demo"),
                        help="a run directory holding logs/ (TensorBoard events)")
    parser.add_argument("--large_batch", default=os.path.join(ROOT, "example_logs", "large_batch"),
                        help="the demo_bs32_test and demo_bs32_opt runs, compared with --run")
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "tutorial_images"))
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"),
                        help="folder of benchmark results (*.json from benchmarks.ladder)")
    parser.add_argument("--profiles", nargs="*", default=[os.path.join(ROOT, "sample_nsys_profiles"),
                                                          os.path.join(ROOT, "sample_nsys_profiles", "dali"),
                                                          os.path.join(ROOT, "example_logs", "cpu_profiles")],
                        help="folders with a profiles.json (from benchmarks.profiles)")
    parser.add_argument("--nsys_profiles", nargs="*", default=[os.path.join(ROOT, "sample_nsys_profiles"),
                                                               os.path.join(ROOT, "sample_nsys_profiles", "dali"),
                                                               os.path.join(ROOT, "sample_nsys_profiles", "cpu")],
                        help="folders whose profiles.json lists Nsight Systems reports (drawn with nsys's help)")
    parser.add_argument("--no_browser", action="store_true", help="skip the TensorBoard screenshot")
    args = parser.parse_args(argv)

    os.makedirs(args.out_dir, exist_ok=True)
    events = load_events(os.path.join(args.run, "logs"))
    loss_curves(events, "demo config on the synthetic data set (2-core CPU)",
                os.path.join(args.out_dir, "demo_loss_curves.png"))
    last_image(events, "Preview", os.path.join(args.out_dir, "demo_preview.png"))
    last_image(events, "Power spectrum", os.path.join(args.out_dir, "demo_power_spectrum.png"))
    print(f"wrote demo_loss_curves.png, demo_preview.png, demo_power_spectrum.png to {args.out_dir}")
    large_batch = {name: os.path.join(args.large_batch, name) for name in ("demo_bs32_test", "demo_bs32_opt")}
    if all(os.path.isdir(run_dir) for run_dir in large_batch.values()):
        large_batch_curves({"demo": args.run, **large_batch}, os.path.join(args.out_dir, "large_batch_loss.png"))
        print(f"wrote large_batch_loss.png from {os.path.relpath(args.large_batch, ROOT)}")
    for path in sorted(glob.glob(os.path.join(args.results, "*.json"))):
        with open(path) as f:
            report = json.load(f)
        name = f"ladder_{os.path.splitext(os.path.basename(path))[0]}.png"
        ladder_chart(report, os.path.join(args.out_dir, name))
        print(f"wrote {name} from {os.path.relpath(path, ROOT)}")
    for name, folder in scaling_figures(args.results, args.out_dir):
        print(f"wrote {name} from {os.path.relpath(folder, ROOT)}")
    from benchmarks import scaling_model  # a computation from published numbers: no results file needed

    scaling_model.figure(os.path.join(args.out_dir, "scaling_model.png"))
    print("wrote scaling_model.png from benchmarks/scaling_model.py")
    for folder in args.profiles:
        for name in profile_figures(folder, args.out_dir):
            print(f"wrote {name} from {os.path.relpath(folder, ROOT)}")
    for folder in args.nsys_profiles:
        for name in nsys_figures(folder, args.out_dir):
            print(f"wrote {name} from {os.path.relpath(folder, ROOT)}")
    domain_figure(os.path.join(args.out_dir, "domain_halo.png"))
    print("wrote domain_halo.png from utils/distributed.py's blocks and utils/halo.py's halo width")
    if args.no_browser:
        return
    from figures import tensorboard_screenshot
    from utils.errors import UserError

    try:
        tensorboard_screenshot.find_chromium()
    except UserError:
        print("Chromium not found: tensorboard_scalars.png not remade (apt-get install chromium).")
        return
    tensorboard_screenshot.main(["--logdir", args.run, "--out", os.path.join(args.out_dir, "tensorboard_scalars.png")])


if __name__ == "__main__":
    main()
