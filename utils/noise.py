"""When repeated timing trials can rank what they measured, and what to print when they cannot.

A benchmark repeats each measurement (benchy's trials, a profile per rung) and compares the means.
On a busy machine the trials of one measurement can differ by more than the difference being
measured: then a ranking (SYNTHETIC below FULL, a negative communication overhead at one rank, one
loader ahead of another) is noise, and the tools print this module's note instead of it.

The rules, kept simple enough to check by hand:

- the *spread* of a measurement's trials is (max - min) / mean;
- trials whose spread exceeds :data:`BUSY_SPREAD` (20%) come from a machine busy with other work:
  their mean is not a finding;
- two measurements are ranked only when their trials do not overlap (every trial of one above
  every trial of the other); a difference inside the overlap is not one.
"""
import statistics

# Beyond this spread (max - min over the mean) the trials say more about the machine's other work
# than about the code: on the project's idle 2-core machine benchy's trials agree to within 10%.
BUSY_SPREAD = 0.20


def spread(trials):
    """(max - min) / mean of the trials; 0 for fewer than two."""
    trials = list(trials)
    if len(trials) < 2:
        return 0.0
    return (max(trials) - min(trials)) / statistics.fmean(trials)


def separated(trials_a, trials_b):
    """Whether every trial of one measurement lies above every trial of the other."""
    return min(trials_a) > max(trials_b) or min(trials_b) > max(trials_a)


def busy_note(measurements):
    """``{name: trials}`` -> a note naming the widest spread when it exceeds :data:`BUSY_SPREAD`, else None:
    "the trials vary by 70% (SYNTHETIC: 12.1 to 70.3): the machine is busy; rerun when it is idle"."""
    measured = {name: list(trials) for name, trials in measurements.items() if len(trials) > 1}
    if not measured:
        return None
    widest = max(measured, key=lambda name: spread(measured[name]))
    trials = measured[widest]
    if spread(trials) <= BUSY_SPREAD:
        return None
    return (f"the trials vary by {100 * spread(trials):.0f}% ({widest}: {min(trials):.3g} to {max(trials):.3g}): "
            "the machine is busy; rerun when it is idle")


def unranked_note(name_a, trials_a, name_b, trials_b):
    """None when the two measurements can be ranked (their trials do not overlap); otherwise a note that
    they cannot, with the busy note when the trials say the machine was busy."""
    if separated(trials_a, trials_b):
        return None
    return busy_note({name_a: trials_a, name_b: trials_b}) or (
        f"{name_a} and {name_b} differ by less than their trials vary: no ranking")


def order_note(measurements, above):
    """A note when the means contradict an order that must hold, or the trials are too spread to say,
    else None. ``measurements``: ``{name: trials}``; ``above``: ``[(higher, lower), ...]``, pairs of
    names whose first cannot be slower than the second (benchy's SYNTHETIC and IO above FULL, which
    does the work of both)."""
    busy = busy_note(measurements)
    for high, low in above:
        if high in measurements and low in measurements and \
                statistics.fmean(measurements[low]) > statistics.fmean(measurements[high]):
            reason = busy or "the machine's load changed between the measurements; rerun when it is idle"
            return f"{low} above {high} cannot be: {reason}"
    return busy
