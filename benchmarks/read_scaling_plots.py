"""Read the points off the original tutorial's final weak-scaling plots, and say how well they can be read.

    python -m benchmarks.read_scaling_plots scale_perfEff.png scale_perfComm.png   # prints the JSON
    python -m benchmarks.read_scaling_plots scale_perfEff.png scale_perfComm.png --out benchmarks/sc22_scaling_points.json

The two PNGs are those of the original's README at NERSC/sc22-dl-tutorial commit 2074095 ("updated
scaling plots", 2022-11-12): bs64_opt on 1, 2, 4, 8, 16 and 32 Perlmutter nodes (4 A100s each,
local batch 64). ``scale_perfEff.png`` draws real data, synthetic data and the data loader alone,
each with its ideal line (N times one node); ``scale_perfComm.png`` draws the same three and real
and synthetic data run with ``--noddp`` (no gradient all-reduce). They are not in this repository
(they are the original's); this script takes their paths, and its output is committed as
``benchmarks/sc22_scaling_points.json``, which ``benchmarks.scaling_model`` reads.

How a point is read: the axes are calibrated on the plot's own grid lines (their pixel positions
fitted against the tick values 0, 5, ..., 30 nodes and 0, 20000, ..., 100000 samples/s); a marker
is a filled disk 8 px across in its line's colour, found at the node count's pixel column as the
place where a disk of radius 3 px is at least 55% that colour (a 2 px line fills at most 40% of it),
its centre the middle of that stretch. Markers drawn later cover earlier ones (the legend's order);
a marker covered by more than about half is not read (``null`` in the output), nor is a lone marker
of a colour that a solid and a dashed curve share (it may be either's).
The reading error is measured, not guessed: the ideal lines must be N times their own 1-node point,
and the three curves that both plots draw must agree between them; ``reading_error`` in the output
is the largest relative deviation of either check (at 4 nodes and more, where markers stand apart).
"""
import argparse
import json
import os
import sys

import numpy as np

NODES = [1, 2, 4, 8, 16, 32]
X_TICKS = [0, 5, 10, 15, 20, 25, 30]                      # nodes, the plots' tick labels
Y_TICKS = [0, 20000, 40000, 60000, 80000, 100000]          # samples/s ("img/sec"), the plots' tick labels
COLOURS = {"green": (0, 128, 0), "darkorange": (255, 140, 0), "darkblue": (0, 0, 139)}  # matplotlib's named colours
GRID, LEGEND_FRAME = 176, 214                               # grey levels of the grid lines and the legend's frame
# Each plot's curves in the order they are drawn (its legend's order): (name, colour, dashed).
PLOTS = {
    "eff": [("real", "green", False), ("synthetic", "darkorange", False), ("loader", "darkblue", False),
            ("real_ideal", "green", True), ("synthetic_ideal", "darkorange", True),
            ("loader_ideal", "darkblue", True)],
    "comm": [("real", "green", False), ("synthetic", "darkorange", False), ("loader", "darkblue", False),
             ("real_noddp", "green", True), ("synthetic_noddp", "darkorange", True)],
}

# Where the two PNGs are looked for when no paths are given: $SC22_PLOTS, else a shared/sc22 folder beside
# the repository's clone (as CI has it) or beside the folder that holds the clone.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT_FOLDERS = [os.path.join(REPOSITORY, *[".."] * up, "shared", "sc22") for up in (1, 2)]


def default_plots():
    """``(eff, comm)``: the two PNGs in $SC22_PLOTS, else in the first of PLOT_FOLDERS that holds both
    (the first if none does: the caller says what is missing)."""
    folders = [os.environ["SC22_PLOTS"]] if os.environ.get("SC22_PLOTS") else PLOT_FOLDERS
    pairs = [tuple(os.path.normpath(os.path.join(folder, f"scale_perf{name}.png")) for name in ("Eff", "Comm"))
             for folder in folders]
    return next((pair for pair in pairs if all(map(os.path.exists, pair))), pairs[0])


def load(path):
    """The image as 0..255 RGB (a PNG's alpha dropped: the plots are opaque)."""
    import matplotlib.image

    return matplotlib.image.imread(path)[..., :3].astype(float) * 255


def adjacent(indices):
    """Sorted pixel indices grouped into runs of neighbours: [[3, 4, 5], [9], ...]."""
    groups = []
    for i in indices:
        if groups and i - groups[-1][-1] <= 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def lines_of(mask, axis, length):
    """Pixel positions (weighted centres) of straight lines in ``mask``: rows (axis=1) or columns
    (axis=0) with more than ``length`` pixels set, adjacent ones merged."""
    counts = mask.sum(axis=axis)
    return [float(np.average(g, weights=counts[g])) for g in adjacent(np.where(counts > length)[0])]


def calibrate(image):
    """Pixel -> value maps for both axes, fitted on the grid lines, and the legend's box to skip."""
    grey = np.abs(image - GRID).max(-1) < 8
    columns, rows = lines_of(grey, 0, 150), lines_of(grey, 1, 200)
    if len(columns) != len(X_TICKS) or len(rows) != len(Y_TICKS):
        raise ValueError(f"expected {len(X_TICKS)} vertical and {len(Y_TICKS)} horizontal grid lines, found "
                         f"{len(columns)} and {len(rows)}: not one of the original's two scaling plots")
    x = np.polyfit(X_TICKS, columns, 1)               # column of a node count
    y = np.polyfit(Y_TICKS, sorted(rows, reverse=True), 1)  # row of a value (rows grow downwards)
    frame = np.abs(image - LEGEND_FRAME).max(-1) < 3
    top, bottom = (int(r) for r in (min(lines_of(frame, 1, 100)), max(lines_of(frame, 1, 100))))
    left, right = (int(c) for c in (min(lines_of(frame, 0, 80)), max(lines_of(frame, 0, 80))))
    residual = max(np.abs(np.polyval(x, X_TICKS) - columns).max(),
                   np.abs(np.polyval(y, Y_TICKS) - sorted(rows, reverse=True)).max())
    return {"x": x, "y": y, "legend": (top, bottom, left, right), "grid_residual_px": float(residual),
            "samples_per_px": float(-1 / y[0])}


def coverage(image, colour):
    """How much of each pixel ``colour`` covers, 0 .. 1, where the pixel is that colour blended with the
    white background (antialiasing); NaN where it is some other colour (another curve, a grid line)."""
    c = np.array(COLOURS[colour], float)
    towards = 255.0 - c
    alpha = ((255.0 - image) @ towards) / (towards @ towards)
    blend = 255.0 - alpha[..., None] * towards
    alpha = np.clip(alpha, 0, 1)
    alpha[np.abs(image - blend).max(-1) > 40] = np.nan
    alpha[np.abs(image - c).max(-1) < 60] = 1.0
    return alpha


def runs(column):
    """Stretches of a colour down one pixel column: (top edge, bottom edge, row above, row below), the
    edges in fractional rows (pixel i covers i - 0.5 .. i + 0.5, a partly covered pixel adds its part);
    the row beyond an edge is None where it is background, else the row of the other colour there."""
    result = []
    for stretch in adjacent(np.where(column >= 0.95)[0]):
        top, bottom = stretch[0], stretch[-1]
        above = column[top - 1] if top > 0 else 0.0
        below = column[bottom + 1] if bottom + 1 < len(column) else 0.0
        result.append((top - 0.5 - (0.0 if np.isnan(above) else above),
                       bottom + 0.5 + (0.0 if np.isnan(below) else below),
                       top - 1 if np.isnan(above) else None, bottom + 1 if np.isnan(below) else None))
    return result


def centres_of(run, diameter, covered):
    """The marker centres a stretch gives: one where it is a diameter long and both its ends are free
    (``covered(row)`` false); two of one colour overlapping where it is longer (their centres half a
    diameter inside its ends); where one end is covered by a marker drawn later, one, half a diameter
    inside the free end, if nearly a whole diameter shows; where both are, none."""
    top, bottom, above, below = run
    top_free = above is None or not covered(above)
    bottom_free = below is None or not covered(below)
    length = bottom - top
    if length < 0.6 * diameter:
        return []  # a line (2-3 px), or a marker almost covered
    if top_free and bottom_free:
        return [(top + bottom) / 2] if length <= diameter + 1 else [top + diameter / 2, bottom - diameter / 2]
    if top_free and length >= diameter - 1:
        return [top + diameter / 2]
    if bottom_free and length >= diameter - 1:
        return [bottom - diameter / 2]
    return []


def marker_diameter(image, axes):
    """A marker's height in pixels, measured on the highest marker at 32 nodes (the synthetic run's
    ideal or --noddp point: nothing is drawn over it)."""
    alpha = coverage(image, "darkorange")
    top, bottom, above, below = runs(alpha[:, int(round(np.polyval(axes["x"], 32)))])[0]
    assert above is None and below is None
    return bottom - top


def read_plot(path, which):
    """{curve: {nodes: samples/s or None}} for one plot, and its calibration.

    Per colour and node count, the markers on the node count's pixel column. Where two curves share a
    colour, two markers are read (the dashed curve, ideal or no all-reduce, is the upper one) and one is
    not: it may be either curve's. Which stretch ends are covered depends on what
    was drawn later, so the markers are read twice: first taking any other colour at an end as
    covering it, then only a marker found the first time whose curve is drawn later."""
    image = load(path)
    axes = calibrate(image)
    axes["marker_px"] = diameter = marker_diameter(image, axes)
    order = [name for name, _, _ in PLOTS[which]]
    colour_of = {name: colour for name, colour, _ in PLOTS[which]}
    top_box, bottom_box, left, right = axes["legend"]
    alphas = {}
    for colour in COLOURS:
        alphas[colour] = coverage(image, colour)
        alphas[colour][:bottom_box + 6, left - 6:right + 7] = np.nan  # the legend's own markers
    found = {}  # (curve, nodes) -> centre row

    def covered_by_later(curve, n):
        later = [other for other in order[order.index(curve) + 1:] if colour_of[other] != colour_of[curve]]
        return lambda row: any((other, n) in found and abs(row - found[(other, n)]) <= diameter / 2 + 0.5
                               for other in later)

    for first in (True, False):
        assigned = {}
        for colour in COLOURS:
            named = sorted((dashed, name) for name, c, dashed in PLOTS[which] if c == colour)
            solid = named[0][1]
            dashed = named[1][1] if len(named) == 2 else None
            for n in NODES:
                x = int(round(np.polyval(axes["x"], n)))
                centres = []
                for run in runs(alphas[colour][:, x]):
                    middle = (run[0] + run[1]) / 2
                    curve = dashed if dashed and (dashed, n) in found and \
                        abs(found[(dashed, n)] - middle) < abs(found.get((solid, n), 1e9) - middle) else solid
                    covered = (lambda row: True) if first else covered_by_later(curve, n)
                    centres += centres_of(run, diameter, covered)
                centres.sort()  # top (highest value) first
                if dashed and len(centres) >= 2:
                    assigned[(dashed, n)], assigned[(solid, n)] = centres[0], centres[1]
                elif centres and not dashed:
                    assigned[(solid, n)] = centres[0]
                # One marker of a colour that two curves share: the solid curve's with the dashed one
                # covered by another colour, or the dashed one's drawn over the solid one's; not read.
        found = assigned
    value = np.poly1d([1 / axes["y"][0], -axes["y"][1] / axes["y"][0]])
    curves = {name: {n: (float(value(found[(name, n)])) if (name, n) in found else None) for n in NODES}
              for name in order}
    return curves, axes


def read(eff_path, comm_path):
    """Both plots, with the checks that measure the reading error."""
    eff, eff_axes = read_plot(eff_path, "eff")
    comm, comm_axes = read_plot(comm_path, "comm")
    per_px = max(eff_axes["samples_per_px"], comm_axes["samples_per_px"])
    deviations = []
    for curve in ("real", "synthetic", "loader"):
        ideal = eff[f"{curve}_ideal"]
        one = ideal[32] / 32 if ideal.get(32) else None  # the ideal's 1-node value, from its most precise point
        for n in NODES:
            pairs = [(f"{curve}_ideal = N x its 1-node value", ideal.get(n), one and n * one),
                     (f"{curve}: N x the ideal's 1-node value", eff[curve].get(n) if n == 1 else None, one),
                     (f"{curve}: the two plots agree", eff[curve].get(n), comm[curve].get(n))]
            deviations += [{"check": check, "nodes": n, "samples_per_s": a - b, "px": (a - b) / per_px}
                           for check, a, b in pairs if a and b and not (check.endswith("value") and n == 32)]
    return {
        "source": "NERSC/sc22-dl-tutorial commit 2074095 (2022-11-12), README's scale_perfEff.png and "
                  "scale_perfComm.png: bs64_opt weak scaling on Perlmutter, 4 A100-40GB per node, local batch 64",
        "command": "python -m benchmarks.read_scaling_plots scale_perfEff.png scale_perfComm.png "
                   "--out benchmarks/sc22_scaling_points.json",
        "units": "samples/s of the whole job; null: the marker is covered by others and not read",
        "samples_per_px": {"eff": eff_axes["samples_per_px"], "comm": comm_axes["samples_per_px"]},
        "grid_residual_px": max(eff_axes["grid_residual_px"], comm_axes["grid_residual_px"]),
        "reading_error_px": max(abs(d["px"]) for d in deviations),
        "reading_error_samples_per_s": max(abs(d["samples_per_s"]) for d in deviations),
        "checks": deviations,
        "eff": {name: {str(n): v for n, v in points.items()} for name, points in eff.items()},
        "comm": {name: {str(n): v for n, v in points.items()} for name, points in comm.items()},
    }


def rounded(result):
    """Values to whole samples/s and errors to 4 digits: what is committed."""
    def walk(value):
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, float):
            return round(value) if abs(value) >= 100 else round(value, 4)
        return value
    return walk(result)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    eff, comm = default_plots()
    parser.add_argument("eff", nargs="?", default=eff, help=f"the original's scale_perfEff.png (default: {eff})")
    parser.add_argument("comm", nargs="?", default=comm, help=f"the original's scale_perfComm.png (default: {comm})")
    parser.add_argument("--out", help="write the JSON here (default: print it)")
    args = parser.parse_args(argv)
    text = json.dumps(rounded(read(args.eff, args.comm)), indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
