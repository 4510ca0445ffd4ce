"""What the browser tests need before they can run: Debian's Chromium and the playwright package.

CI runs the suite as root on a fresh machine, so a missing Chromium is installed here with apt-get
(Playwright's own browser download is neither wanted nor possible there). Elsewhere, without root,
the tests are skipped with the reason, except under CI (``CI`` set), where a skip would hide that
the browser tests never ran: there they fail.
"""
import os
import shutil
import subprocess

import pytest

from conftest import timeout_for, unavailable
from utils.errors import UserError
from figures.tensorboard_screenshot import find_chromium


def ensure_chromium():
    """The path of a Chromium to drive, installing Debian's package first when root and it is missing."""
    try:
        import playwright.sync_api  # noqa: F401  (the driver of the browser)
    except ImportError:
        unavailable("the playwright package is missing: pip install -r requirements-test.txt")
    try:
        return find_chromium()
    except UserError:
        pass
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        unavailable("Chromium is not installed and this is not a root shell with apt-get to install it "
                    "(apt-get install chromium)")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout_for(900))
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-2000:]}\n"
                        f"{result.stderr[-2000:]}", pytrace=False)
    return find_chromium()
