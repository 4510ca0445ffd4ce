"""The tutorial's figures, made from committed results of real runs (`make figures`).

    python -m utils.figures                      # all figures from example_logs/ into tutorial_images/

- ``demo_loss_curves.png``: train and validation loss of the example demo run, read from its
  TensorBoard event files with TensorBoard's own reader.
- ``demo_preview.png`` and ``demo_power_spectrum.png``: the last preview and power-spectrum images
  that run logged to TensorBoard.
- ``tensorboard_scalars.png``: TensorBoard's scalars page for that run, shot in headless Chromium
  (skipped with a message when Chromium is missing).

Each figure's caption in README.md names the run (command, device, date) that produced the logs.
"""
import argparse
import io
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    if not events.Tags()["scalars"]:
        sys.exit(f"error: no TensorBoard scalars under {log_dir}")
    return events


def loss_curves(events, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def last_image(events, tag, path):
    """The last image logged under ``tag``, written as it was logged (PNG bytes)."""
    import matplotlib.image

    encoded = events.Images(tag)[-1].encoded_image_string
    image = matplotlib.image.imread(io.BytesIO(encoded), format="png")
    matplotlib.image.imsave(path, np.asarray(image))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Make the tutorial's figures from example_logs/.")
    parser.add_argument("--run", default=os.path.join(ROOT, "example_logs", "demo"),
                        help="a run directory holding logs/ (TensorBoard events)")
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "tutorial_images"))
    parser.add_argument("--no_browser", action="store_true", help="skip the TensorBoard screenshot")
    args = parser.parse_args(argv)

    os.makedirs(args.out_dir, exist_ok=True)
    events = load_events(os.path.join(args.run, "logs"))
    loss_curves(events, "demo config on the synthetic data set (2-core CPU)",
                os.path.join(args.out_dir, "demo_loss_curves.png"))
    last_image(events, "Preview", os.path.join(args.out_dir, "demo_preview.png"))
    last_image(events, "Power spectrum", os.path.join(args.out_dir, "demo_power_spectrum.png"))
    print(f"wrote demo_loss_curves.png, demo_preview.png, demo_power_spectrum.png to {args.out_dir}")
    if args.no_browser:
        return
    from utils import tensorboard_screenshot
    from utils.errors import UserError

    try:
        tensorboard_screenshot.find_chromium()
    except UserError:
        print("Chromium not found: tensorboard_scalars.png not remade (apt-get install chromium).")
        return
    tensorboard_screenshot.main(["--logdir", args.run, "--out", os.path.join(args.out_dir, "tensorboard_scalars.png")])


if __name__ == "__main__":
    main()
