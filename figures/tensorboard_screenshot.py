"""Make the tutorial's TensorBoard picture: the scalars page of a log directory, shot in headless Chromium.

    python -m figures.tensorboard_screenshot --logdir runs/demo --out tutorial_images/tensorboard_scalars.png
    python -m figures.tensorboard_screenshot --logdir runs --tag_filter 'Loss|Metrics/corr' --run_filter demo

It starts TensorBoard on a free localhost port (utils.tensorboard_launch), opens the SCALARS
dashboard with the charts filtered to one group (by default that of ``--tag``, ``Loss/valid``),
waits until the ``--tag`` chart has drawn its line, saves a PNG and stops TensorBoard. A picture
made this way shows what a reader's TensorBoard really shows, and remaking it after a change to
the logged scalars is one command.

The browser is the system's Chromium (Debian/Ubuntu: ``apt-get install chromium``) driven by the
Playwright library; Playwright's own browser downloads are not needed. The test of
start_tensorboard.ipynb drives the browser through :func:`screenshot_scalars` too.
"""
import argparse
import json
import os
import re
import shutil
import urllib.parse

from utils.errors import UserError, exit_on_user_error
from utils.files import atomic_path
from utils.tensorboard_launch import open_local, start_tensorboard

BROWSER_VARIABLE = "CHROMIUM"  # overrides where the browser is looked for
BROWSER_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
# Headless and quiet: no GPU, and none of the background connections (updates, sync, QUIC probes)
# that a machine without internet access refuses one by one, slowly.
CHROMIUM_FLAGS = ("--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")
VIEWPORT = {"width": 1200, "height": 800}


def find_chromium(explicit=None):
    """Path of the Chromium to drive: ``explicit``, ``$CHROMIUM``, or the first candidate installed."""
    if explicit:
        if not shutil.which(explicit):
            raise UserError(f"The browser {explicit} does not exist or is not executable.")
        return shutil.which(explicit)
    for candidate in (os.environ.get(BROWSER_VARIABLE), *BROWSER_CANDIDATES):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise UserError("No Chromium found. Install it (Debian/Ubuntu: apt-get install chromium), or pass "
                    f"--browser PATH (or set {BROWSER_VARIABLE}) to a Chromium or Chrome executable.")


def scalars_url(base_url, tag_filter="", run_filter="", smoothing=0.0):
    """The SCALARS dashboard URL with its tag and run filters and chart settings (the page's hash state).

    No smoothing by default: a tutorial picture should show the values that were logged.
    """
    state = {"tagFilter": tag_filter, "regexInput": run_filter, "_smoothingWeight": smoothing}
    encoded = "&".join(f"{key}={urllib.parse.quote(str(value), safe='')}" for key, value in state.items()
                       if value != "")
    return f"{base_url.rstrip('/')}/#scalars&{encoded}"


def group_filter(tag):
    """The regex of ``tag``'s group: ``Loss/valid`` -> ``^Loss/``, so the shot shows its neighbours too."""
    group, slash, _ = tag.partition("/")
    return f"^{re.escape(group)}/" if slash else f"^{re.escape(tag)}$"


def screenshot_scalars(base_url, out_path, tag="Loss/valid", tag_filter=None, run_filter="", browser=None,
                       timeout=60.0):
    """Open TensorBoard at ``base_url``, wait for the ``tag`` chart to draw, save a PNG at ``out_path``.

    ``tag_filter`` (a regex, default: ``tag``'s group) picks the charts shown, ``run_filter`` the
    runs. Returns the dashboard URL that was shot.
    """
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError("The Python package playwright is missing: pip install playwright (the system's "
                        "Chromium is used, so 'playwright install' is not needed).") from None
    executable = find_chromium(browser)
    url = scalars_url(base_url, group_filter(tag) if tag_filter is None else tag_filter, run_filter)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS), headless=True)
        try:
            page = chromium.new_page(viewport=VIEWPORT)
            page.goto(url)
            # The card of the tag, then the line it draws once its data has arrived. Playwright's
            # locators see through the dashboard's shadow DOM.
            card = page.locator("tf-scalar-card").filter(has=page.get_by_text(tag, exact=True))
            try:
                card.locator("path.line").first.wait_for(state="attached", timeout=timeout * 1000)
            except PlaywrightError:
                raise UserError(f"TensorBoard at {base_url} drew no chart for the tag {tag!r} within {timeout:g} s. "
                                f"Its scalar tags: {_scalar_tags(base_url)}. Pick one with --tag, or point "
                                "--logdir at a directory with training runs.") from None
            _show_outliers(page)
            page.wait_for_load_state("networkidle")
            # Down to the row of charts that holds the tag: the groups below would be cut anyway.
            box = card.first.bounding_box()
            height = min(VIEWPORT["height"], int(box["y"] + box["height"]) + 16) if box else VIEWPORT["height"]
            image = page.screenshot(clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
        finally:
            chromium.close()
    _write_atomically(out_path, image)
    return url


def _show_outliers(page):
    """Untick "Ignore outliers in chart scaling": it cuts off the step-0 loss, the start of the curve.

    A checkbox, not URL state: TensorBoard keeps this setting in the browser's local storage.
    """
    checkbox = page.locator("paper-checkbox", has_text="Ignore outliers in chart scaling")
    if checkbox.count() and checkbox.first.get_attribute("aria-checked") == "true":
        checkbox.first.click()
        page.wait_for_timeout(500)  # the charts rescale on the next animation frames


def _scalar_tags(base_url):
    """Every scalar tag TensorBoard has, over all runs, for an error message."""
    try:
        with open_local(f"{base_url.rstrip('/')}/data/plugin/scalars/tags") as response:
            runs = json.load(response)
    except (OSError, ValueError) as error:
        return f"(could not ask: {error})"
    return sorted({tag for tags in runs.values() for tag in tags}) or "none"


def _write_atomically(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as temporary, open(temporary, "wb") as f:
        f.write(data)


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", required=True, help="TensorBoard log directory (e.g. runs/demo)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--tag", default="Loss/valid", help="the chart to wait for (default: %(default)s)")
    parser.add_argument("--tag_filter", default=None,
                        help="regex of the charts to show, e.g. 'Loss|Metrics/corr' (default: the group of --tag)")
    parser.add_argument("--run_filter", default="", help="regex of the runs to show (default: all)")
    parser.add_argument("--browser", default=None, help=f"Chromium executable (default: ${BROWSER_VARIABLE}, "
                                                        "else /usr/bin/chromium or chromium on PATH)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each stage")
    args = parser.parse_args(argv)

    find_chromium(args.browser)  # before starting anything: a missing browser is the likeliest mistake
    server = start_tensorboard(args.logdir, timeout=args.timeout)
    try:
        url = screenshot_scalars(server.url, args.out, args.tag, args.tag_filter, args.run_filter, args.browser,
                                 args.timeout)
    finally:
        server.stop()
    print(f"Wrote {args.out} ({url})")


if __name__ == "__main__":
    main()
