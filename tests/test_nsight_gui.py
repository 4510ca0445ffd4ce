"""The Nsight Systems GUI picture (figures/nsight_gui.py): a committed report opened in nsys-ui on a virtual
display and shot, and the committed picture is what the command makes of the report now.

The GUI is Debian's 2022.4, unpacked with the CLI by tests/nsight_cli.py; its display (Xvfb, xdotool) and
X11 libraries are installed with apt-get where the suite runs as root (CI), as tests/browser.py installs
Chromium. Elsewhere the tests that run the GUI are skipped with the command that installs them, except
under CI, where they fail.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, timeout_for, unavailable
from figures import nsight_gui
from nsight_cli import ensure_nsys
from utils.errors import UserError

REPORT = os.path.join(ROOT, "sample_nsys_profiles", "cpu", "baseline.nsys-rep")
COMMITTED = os.path.join(ROOT, "tutorial_images", "nsys_gui_sample_nsys_profiles_cpu_baseline.png")
# The dark green strip under a thread's row, "Likely running" in the GUI's tooltip (a state it infers from the
# OS calls; 2022.4's light theme).
RUNNING_GREEN = (10, 81, 38)


@pytest.fixture(scope="module")
def gui():
    """The nsys-ui to run, with what it needs to run headless (installed with apt-get when root)."""
    ensure_nsys()  # Debian's Nsight Systems, GUI included, where the machine has no nsys
    try:
        found = nsight_gui.find_gui()
    except UserError as error:
        unavailable(str(error))
    try:
        nsight_gui.check_tools(found)
    except UserError as error:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            unavailable(str(error))
        environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", *nsight_gui.DEBIAN_PACKAGES]):
            result = subprocess.run(command, env=environment, capture_output=True, text=True,
                                    timeout=timeout_for(900))
            if result.returncode != 0:
                pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-2000:]}\n"
                            f"{result.stderr[-2000:]}", pytrace=False)
        nsight_gui.check_tools(found)
    return found


def read_png(path):
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def test_without_a_gui_the_error_says_where_to_get_one(tmp_path, monkeypatch):
    """No nsys-ui anywhere it looks: one paragraph that names the install command, NVIDIA's download and the
    display's packages."""
    monkeypatch.delenv(nsight_gui.GUI_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(nsight_gui.nsight, "find_nsys", lambda: None)
    monkeypatch.setattr(nsight_gui.nsight, "DEFAULT_DIR", str(tmp_path / "nsight-systems-2022.4"))
    monkeypatch.setattr(nsight_gui.glob, "glob", lambda pattern: [])  # nothing under /opt/nvidia
    with pytest.raises(UserError) as error:
        nsight_gui.find_gui()
    message = str(error.value)
    assert "python -m benchmarks.nsight install" in message and "https://developer.nvidia.com/nsight-systems" in message
    assert "apt-get install xvfb xdotool" in message and "\n" not in message


def test_a_gui_that_is_not_there_is_refused_in_one_paragraph(tmp_path):
    result = subprocess.run([sys.executable, "-m", "figures.nsight_gui", "--gui", str(tmp_path / "nsys-ui"),
                             "--out_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout_for(60))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "does not exist or is not executable" in result.stderr and not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_gui_draws_the_committed_report(gui, tmp_path):
    """`python -m figures.nsight_gui` opens the CPU baseline in the GUI and saves the timeline it drew: the
    window's size, the "likely running" strips of the run's threads in the GUI's colour (the channels in their order),
    and every row shown (the events view below dragged shut)."""
    result = subprocess.run([sys.executable, "-m", "figures.nsight_gui", REPORT, "--out_dir", str(tmp_path),
                             "--gui", gui], cwd=ROOT, capture_output=True, text=True, timeout=timeout_for(180))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    path = tmp_path / "nsys_gui_sample_nsys_profiles_cpu_baseline.png"
    assert f"Wrote {path}" in result.stdout and "Nsight Systems 2022.4" in result.stdout
    pixels = read_png(path)
    height, width = pixels.shape[:2]
    assert (width, height) == nsight_gui.SIZE
    assert pixels.std() > 20 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # not a flat screen
    timeline = pixels[:, width // 3:]  # right of the project explorer and the rows' names
    green = (timeline == np.array(RUNNING_GREEN, dtype=np.uint8)).all(axis=-1)
    assert green.mean() > 0.002, float(green.mean())  # the loading screen and an empty report have none
    assert nsight_gui.splitter_row(pixels) is None  # the bar above the events view is no longer mid-screen


@pytest.mark.slow
def test_the_committed_picture_is_what_the_command_makes_now(gui, tmp_path):
    """tutorial_images/nsys_gui_sample_nsys_profiles_cpu_baseline.png is the picture the command makes of the
    committed report today: a report made again, or a picture edited by hand, shows up here. (The GUI draws
    the same pixels run after run on one machine; fonts other than Debian's DejaVu would move some.)"""
    nsight_gui.screenshot_report(REPORT, str(tmp_path / "now.png"), gui)
    committed, now = read_png(COMMITTED), read_png(tmp_path / "now.png")
    assert committed.shape == now.shape
    same = (committed == now).all(axis=-1).mean()
    assert same > 0.98, (f"{same:.1%} of the pixels agree: remake the picture with `python -m figures.nsight_gui` "
                         "and check it")
