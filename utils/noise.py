"""When repeated timing trials can rank what they measured, and what to print when they cannot.

A benchmark repeats each measurement (benchy's trials, the steps of a profile, the runs of a scaling
point) and compares the means. On a busy machine the trials of one measurement can differ by more
than the difference being measured: then a ranking (SYNTHETIC below FULL, a negative communication
overhead at one rank, one loader ahead of another) is noise. Every tool that prints a throughput, a
time or a ratio judges its trials here, and prints the one line of :func:`busy_line` when they
cannot rank or compare: "the machine was busy: N% spread; rerun on an idle machine".

The rules, kept simple enough to check by hand:

- the *spread* of a measurement's trials is (max - min) / mean; a long series of steps (a
  profile's) is judged by the spread of its middle half, (third quartile - first quartile) /
  median, since it holds the loader's periodic stalls even on an idle machine, and by its slowest
  step, which more than twice the median is another program's doing;
- trials whose spread exceeds :data:`BUSY_SPREAD` (20%) come from a machine busy with other work:
  their mean is not a finding;
- an order that must hold and does not (FULL, which does the work of both, above SYNTHETIC or IO)
  is the same sign: the load changed between the measurements;
- two measurements are ranked only when their trials do not overlap (every trial of one above
  every trial of the other); a difference inside the overlap is not one.
"""
import statistics

# Beyond this spread (max - min over the mean) the trials say more about the machine's other work
# than about the code: on the project's idle 2-core machine benchy's trials agree to within 10%.
BUSY_SPREAD = 0.20
# A step of a profile more than this many times its series' median was stalled by other work: a loader's
# late batch costs the project's idle 2-core machine 1.4 times the median forward pass (baseline rung,
# python -m benchmarks.profiles --preset cpu, 2026-11-26), a busy one 16 times (590.1 ms against 35.5).
STEP_OUTLIER = 2.0

# benchy's kinds: FULL loads (IO) and trains (SYNTHETIC), so it cannot be faster than either.
BENCHY_ORDER = (("SYNTHETIC", "FULL"), ("IO", "FULL"))


def spread(trials):
    """(max - min) / mean of the trials; 0 for fewer than two."""
    trials = list(trials)
    if len(trials) < 2:
        return 0.0
    return (max(trials) - min(trials)) / statistics.fmean(trials)


def middle_spread(steps):
    """(third quartile - first quartile) / median of a series of steps; 0 for fewer than four. One slow
    step in four (a loader worker's batch arriving late) does not move it."""
    steps = list(steps)
    if len(steps) < 4:
        return 0.0
    first, _, third = statistics.quantiles(steps, n=4, method="inclusive")
    return (third - first) / statistics.median(steps)


def summary(trials):
    """What a result file keeps of a measurement: its trials, and their mean, median, population std,
    min, max and spread (None for each without trials)."""
    trials = [float(value) for value in trials]
    if not trials:
        return {"trials": [], "mean": None, "median": None, "std": None, "min": None, "max": None, "spread": None}
    return {"trials": trials, "mean": statistics.fmean(trials), "median": statistics.median(trials),
            "std": statistics.pstdev(trials), "min": min(trials), "max": max(trials), "spread": spread(trials)}


def number(value):
    """A trial's value in a line: three significant digits ("1.34", "590"), whole units from 1000 up ("2190")."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def spread_text(trials):
    """The spread as a table prints it: "4%", or "-" for a single trial."""
    trials = list(trials)
    return f"{100 * spread(trials):.0f}%" if len(trials) > 1 else "-"


def separated(trials_a, trials_b):
    """Whether every trial of one measurement lies above every trial of the other."""
    return min(trials_a) > max(trials_b) or min(trials_b) > max(trials_a)


def widest(measurements, width=spread):
    """``(name, spread)`` of the measurement (``{name: trials}``) whose trials vary most by ``width``
    (:func:`spread`, or :func:`middle_spread` for series of steps); (None, 0.0) when none has two trials."""
    measured = {name: list(trials) for name, trials in measurements.items() if len(trials) > 1}
    if not measured:
        return None, 0.0
    name = max(measured, key=lambda key: width(measured[key]))
    return name, width(measured[name])


def broken_orders(measurements, above=()):
    """The pairs of ``above`` (``[(higher, lower), ...]``: the first cannot be slower than the second)
    whose means say otherwise: "FULL above SYNTHETIC: 36.5 against 9.6"."""
    broken = []
    for high, low in above:
        if measurements.get(high) and measurements.get(low):
            mean_high, mean_low = statistics.fmean(measurements[high]), statistics.fmean(measurements[low])
            if mean_low > mean_high:
                broken.append(f"{order_text(low, high)}: {number(mean_low)} against {number(mean_high)}")
    return broken


def order_text(low, high):
    """"FULL above SYNTHETIC"; for names of one measurement's kinds ("rung: FULL", "rung: SYNTHETIC"),
    "rung: FULL above SYNTHETIC"."""
    owner, _, kind_low = low.rpartition(": ")
    if owner and high.startswith(owner + ": "):
        return f"{owner}: {kind_low} above {high[len(owner) + 2:]}"
    return f"{low} above {high}"


def busy_line(measurements, above=(), steps=False):
    """The line a tool prints when its trials cannot rank or compare, else None: "the machine was busy:
    68% spread (SYNTHETIC 1.34 to 2.64); rerun on an idle machine". ``measurements``: ``{name: trials}``;
    ``above``: pairs ``(higher, lower)`` whose order must hold (see :func:`broken_orders`): one that
    does not is named in the line too, whatever the spread. ``steps``: the measurements are series of
    steps, judged by their middle half (:func:`middle_spread`)."""
    name, width = widest(measurements, middle_spread if steps else spread)
    middle = steps and width > BUSY_SPREAD
    if steps and not middle:  # a step far beyond its series' median: another program took the cores
        outliers = {key: trials for key, trials in measurements.items()
                    if len(trials) >= 4 and max(trials) > STEP_OUTLIER * statistics.median(trials)}
        if outliers:
            name, width = widest(outliers)
    broken = broken_orders(measurements, above)
    if width <= BUSY_SPREAD and not broken:
        return None
    trials = measurements[name] if name is not None else []
    if middle:
        first, _, third = statistics.quantiles(trials, n=4, method="inclusive")
        details = [f"{name}: the middle half of its steps {number(first)} to {number(third)}"]
    else:
        details = [f"{name} {number(min(trials))} to {number(max(trials))}"] if width > BUSY_SPREAD else []
    details += broken[:1] + ([f"{len(broken) - 1} more such"] if len(broken) > 1 else [])
    return f"the machine was busy: {100 * width:.0f}% spread ({'; '.join(details)}); rerun on an idle machine"


def order_note(measurements, above):
    """:func:`busy_line` with the orders that must hold (benchy's summary: :data:`BENCHY_ORDER`)."""
    return busy_line(measurements, above)


def unranked_note(name_a, trials_a, name_b, trials_b):
    """None when the two measurements can be ranked (their trials do not overlap); otherwise a note that
    they cannot: :func:`busy_line` when the trials say the machine was busy."""
    if separated(trials_a, trials_b):
        return None
    return busy_line({name_a: trials_a, name_b: trials_b}) or (
        f"{name_a} and {name_b} differ by less than their trials vary: no ranking")


def compare_line(what, here, reference, source, busy=None):
    """The line that sets a tool's number beside the one the README quotes: "The number to compare
    (README): <what>: <here>; the README's: <reference> (<source>)", and when ``busy`` (a
    :func:`busy_line`) says the trials cannot compare, that line after it instead of a comparison."""
    line = f"The number to compare (README): {what}: {here}; the README's: {reference} ({source})."
    return line + (f" Not comparable: {busy}." if busy else "")
