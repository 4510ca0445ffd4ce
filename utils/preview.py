"""The pictures users want: after each validation, one central slice of input, truth and prediction;
at the end of a run, its loss curves.

The slice has five panels: input dark-matter density, true and predicted gas density, true and
predicted gas temperature, truth and prediction on the same colour scale so that they compare at a
glance. The loss curves are the train and validation losses the run logged to TensorBoard.
"""
import numpy as np

from utils.files import atomic_path

PANELS = (  # (title, source, channel)
    ("dark-matter density (input)", "input", 0),
    ("gas density (true)", "target", 0),
    ("gas density (predicted)", "prediction", 0),
    ("temperature (true)", "target", 1),
    ("temperature (predicted)", "prediction", 1),
)


def render_preview(sample, title=""):
    """An (H, W, 3) uint8 image of the central slice; ``sample`` maps 'input'/'target'/'prediction'
    to one sample's (C, D, H, W) numpy arrays."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in batch jobs
    import matplotlib.pyplot as plt

    middle = sample["input"].shape[1] // 2
    fig, axes = plt.subplots(1, len(PANELS), figsize=(3.2 * len(PANELS), 3.4), dpi=80)
    for ax, (name, source, channel) in zip(axes, PANELS):
        field = sample[source][channel, middle]
        # Truth and prediction of a field share the truth's colour range; percentiles, so that one
        # nearly empty voxel of a void does not wash out the rest.
        reference = sample["target" if source != "input" else "input"][channel, middle]
        low, high = np.percentile(reference, [1, 99])
        ax.imshow(field, cmap="inferno" if channel == 0 else "viridis", vmin=low, vmax=high, origin="lower")
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))  # leave room for the title above the panels
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


def save_png(path, image):
    """Write ``image`` as a PNG atomically (temporary file, then rename)."""
    import matplotlib.image

    with atomic_path(path, suffix=".png") as temporary:
        matplotlib.image.imsave(temporary, image)


LOSS_TAGS = (("Loss/train", "train", "o-"), ("Loss/valid", "validation", "s-"))


def logged_losses(log_dir):
    """``{tag: [(step, value), ...]}`` of the train and validation losses the run logged to TensorBoard
    under ``log_dir`` (every session of a resumed run; a step logged twice keeps its last value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    return {tag: sorted({event.step: event.value for event in events.Scalars(tag)}.items())
            for tag, _, _ in LOSS_TAGS if tag in tags}


def render_loss_curves(losses, title=""):
    """An (H, W, 3) uint8 image: the train and validation loss (``logged_losses``) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=80)
    for tag, label, style in LOSS_TAGS:
        steps, values = zip(*losses[tag]) if losses.get(tag) else ((), ())
        ax.plot(steps, values, style, label=label)
    ax.set(xlabel="optimiser step", ylabel="loss", yscale="log", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image
