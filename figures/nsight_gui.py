"""Make the tutorial's Nsight Systems GUI picture: a committed report opened in ``nsys-ui``, shot headless.

    python -m figures.nsight_gui        # sample_nsys_profiles/cpu/baseline.nsys-rep -> tutorial_images/
    python -m figures.nsight_gui sample_nsys_profiles/cpu/gpu_inmem.nsys-rep --out_dir /tmp/shots

It starts a virtual X display (Xvfb), opens the report in the Nsight Systems GUI there, sizes the
window to the display, waits until the GUI has loaded the report and drawn its timeline, drags the
timeline's lower edge down so that every row of the report shows, and saves the display as
``nsys_gui_<folder>_<report>.png`` (``<folder>``: the report's folder, as ``make figures`` names
its images). A picture made this way is what a reader sees when they open the report, and remaking
it is one command.

The GUI is the one of Debian's ``nsight-systems`` 2022.4 that ``python -m benchmarks.nsight install``
unpacks (no root needed), or any ``nsys-ui`` on PATH or under /opt/nvidia. It runs on a CPU: it
draws with Mesa's software OpenGL. It starts with a settings folder of its own, where the two
questions of a first start are already answered (no usage data to NVIDIA; the default rows preset),
so the reader's own settings play no part. The display needs the ``xvfb`` and ``xdotool`` packages,
and the GUI a few X11 libraries (:data:`DEBIAN_PACKAGES`).
"""
import argparse
import contextlib
import glob
import hashlib
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import numpy as np

from benchmarks import nsight
from utils.errors import UserError, exit_on_user_error
from utils.files import atomic_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_REPORT = os.path.join(ROOT, "sample_nsys_profiles", "cpu", "baseline.nsys-rep")
DEFAULT_OUT_DIR = os.path.join(ROOT, "tutorial_images")
GUI_VARIABLE = "NSYS_UI"  # overrides where the GUI is looked for
# What the GUI and its virtual display need on Debian 12 beyond a minimal system: the display server, the
# window tool, the X11 and OpenGL libraries that nsys-ui's bundled Qt 6 links or loads (Mesa draws on a CPU),
# and a font.
DEBIAN_PACKAGES = ("xvfb", "xdotool", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0", "libxcb-render-util0",
                   "libxcb-randr0", "libxcb-shape0", "libxcb-xkb1", "libxkbcommon-x11-0", "libxkbfile1",
                   "libxcomposite1", "libxdamage1", "libxrandr2", "libxtst6", "libnss3", "libasound2", "libpfm4",
                   "libgl1", "libegl1", "libopengl0", "libglx-mesa0", "libgl1-mesa-dri", "fonts-dejavu-core")
INSTALL_HINT = f"Debian 12: apt-get install {' '.join(DEBIAN_PACKAGES)}"
SIZE = (1600, 760)
# The timeline's lower edge in the GUI's light theme: a bar of this grey, a few pixels high, across the
# report's pane (2022.4).
SPLITTER_GREY = (192, 192, 192)
# Nothing drawn and no CPU used for this long: the GUI has loaded the report and drawn it.
QUIET_SECONDS = 3.0
# The first start's two questions, answered; {version} is the GUI's, e.g. 2022.4.2.
FIRST_START_SETTINGS = """[CorePlugin.Privacy]
AskedFor_NVIDIA%20Nsight%20Systems_{version}=HasAsked
CorePlugin.AllowAnalytics=false

[CorePlugin.Environment]
CorePlugin.ShowVersionUpdateNotifications=false

[QuadDPlugin.OptionsPreset]
QuadDPlugin.AskedFor_NVIDIA%20Nsight%20Systems_{version}=HasAsked
QuadDPlugin.OptionsPreset=graphicsPreset
"""


def find_gui(explicit=None):
    """Path of the Nsight Systems GUI: ``explicit``, ``$NSYS_UI``, ``nsys-ui`` on PATH, the host half beside
    the nsys that benchmarks.nsight finds, NVIDIA's installation under /opt/nvidia, or Debian's unpacked
    copy. A missing GUI raises a :class:`UserError` that says how to get one."""
    if explicit:
        if not shutil.which(explicit):
            raise UserError(f"The Nsight Systems GUI {explicit} does not exist or is not executable.")
        return shutil.which(explicit)
    candidates = [os.environ.get(GUI_VARIABLE), shutil.which("nsys-ui")]
    nsys = nsight.find_nsys()
    if nsys:  # target-linux-x64/nsys beside host-linux-x64/nsys-ui, or bin/nsys beside bin/nsys-ui
        folder = os.path.dirname(os.path.realpath(nsys))
        candidates += [os.path.join(folder, "nsys-ui"), os.path.join(folder, os.pardir, "host-linux-x64", "nsys-ui")]
    candidates += sorted(glob.glob("/opt/nvidia/nsight-systems*/*/bin/nsys-ui"))[-1:]
    candidates.append(os.path.join(nsight.DEFAULT_DIR, "root", nsight.HOST, "nsys-ui"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise UserError("No Nsight Systems GUI (nsys-ui) found: not on PATH, not beside an nsys, not under /opt/nvidia "
                    f"or {nsight.DEFAULT_DIR}. `python -m benchmarks.nsight install` unpacks Debian's Nsight Systems "
                    "2022.4 with its GUI there (about 600 MB, no root needed); NVIDIA's own is at "
                    "https://developer.nvidia.com/nsight-systems (Linux, Windows, macOS). Or pass --gui PATH (or set "
                    f"{GUI_VARIABLE}) to an nsys-ui. To draw the picture, the GUI also needs X11 libraries and a "
                    f"virtual display: {INSTALL_HINT}.")


def gui_folder(gui):
    """The folder of the GUI's real program (nsys-ui.bin) and its bundled Qt libraries."""
    folder = os.path.dirname(os.path.realpath(gui))
    beside = os.path.join(folder, os.pardir, "host-linux-x64")  # NVIDIA's bin/nsys-ui starts the host half's
    return folder if os.path.exists(os.path.join(folder, "nsys-ui.bin")) else os.path.normpath(beside)


def gui_version(gui):
    """The GUI's version (``2022.4.2``), as its settings name it: from its launcher or from the nsys beside it."""
    with open(gui, "rb") as f:
        match = re.search(rb'"(\d{4}\.\d+\.\d+)[^"]*\(Build', f.read(100_000))
    if match:
        return match.group(1).decode()
    for nsys in (os.path.join(os.path.dirname(os.path.realpath(gui)), "nsys"),
                 os.path.join(gui_folder(gui), os.pardir, "target-linux-x64", "nsys")):
        if os.access(nsys, os.X_OK):
            found = re.search(r"(\d{4}\.\d+\.\d+)", nsight.nsys_run(nsys, ["--version"]))
            if found:
                return found.group(1)
    return None


def missing_libraries(gui):
    """The libraries that the GUI and its X11 plugin link and the machine lacks (``ldd``'s "not found")."""
    folder = gui_folder(gui)
    binaries = [os.path.join(folder, "nsys-ui.bin"), os.path.join(folder, "Plugins", "platforms", "libqxcb.so")]
    if not shutil.which("ldd"):
        return []
    missing = set()
    for binary in filter(os.path.exists, binaries):
        result = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "LD_LIBRARY_PATH": folder})
        missing |= {line.split()[0] for line in result.stdout.splitlines() if "not found" in line}
    return sorted(missing)


def check_tools(gui):
    """Raise a :class:`UserError` naming what is missing to run ``gui`` headless: the tools, the libraries."""
    tools = [tool for tool in ("Xvfb", "xdotool") if not shutil.which(tool)]
    libraries = missing_libraries(gui)
    if tools or libraries:
        lacking = ", ".join(tools + libraries)
        raise UserError(f"The Nsight Systems GUI ({gui}) cannot be run headless here: {lacking} missing. "
                        f"{INSTALL_HINT}.")


# ----------------------------------------------------------------------------- the display

def read_framebuffer(path):
    """The screen of an ``Xvfb -fbdir`` framebuffer (an XWD image, 24 bits in 32) as an RGB array."""
    with open(path, "rb") as f:
        data = f.read()
    (header_size, _, _, depth, width, height, _, byte_order, _, _, _, bits_per_pixel, bytes_per_line, _,
     red_mask, green_mask, blue_mask, _, _, colours) = struct.unpack(">20I", data[:80])
    if bits_per_pixel != 32 or depth != 24:
        raise UserError(f"{path}: a {depth}-bit screen in {bits_per_pixel}-bit pixels; expected 24 in 32.")
    start = header_size + 12 * colours  # the header, the window's name, then the colour map
    pixels = np.frombuffer(data, dtype="<u4" if byte_order == 0 else ">u4", count=height * bytes_per_line // 4,
                           offset=start).reshape(height, bytes_per_line // 4)[:, :width]
    channels = [(pixels & mask) >> (mask & -mask).bit_length() - 1 for mask in (red_mask, green_mask, blue_mask)]
    return np.stack(channels, axis=-1).astype(np.uint8)


@contextlib.contextmanager
def virtual_display(folder, size=SIZE):
    """An Xvfb display of ``size`` (no cursor drawn, no TCP) on a free number; yields (DISPLAY, framebuffer)."""
    os.makedirs(folder, exist_ok=True)
    log = os.path.join(folder, "xvfb.log")
    read, write = os.pipe()
    with open(log, "w") as output:
        server = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{size[0]}x{size[1]}x24",
                                   "-fbdir", folder, "-nolisten", "tcp", "-nocursor"], pass_fds=(write,),
                                  stdout=subprocess.DEVNULL, stderr=output)
    os.close(write)
    try:
        with os.fdopen(read) as announced:
            number = announced.readline().strip()  # Xvfb writes its display's number once it accepts clients
        if not number:
            raise UserError(f"Xvfb did not start: {log_tail(log)}")
        yield f":{number}", os.path.join(folder, "Xvfb_screen0")
    finally:
        server.terminate()
        server.wait(timeout=30)


def xdotool(display, *args):
    """``xdotool ARGS`` on ``display``; its output's words (window ids, a name)."""
    result = subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "DISPLAY": display})
    return result.stdout.split()


# ----------------------------------------------------------------------------- the GUI

def session_cpu_seconds(session):
    """CPU seconds used so far by the processes of ``session`` (a process group: the GUI, its launcher)."""
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == session:  # the process group; utime and stime follow at 11 and 12
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(gui, framebuffer, timeout, log, changed_from=None):
    """Wait until the screen has not changed and the GUI has used (almost) no CPU for QUIET_SECONDS: it has
    loaded the report and drawn it. With ``changed_from`` (a screen), the screen must first differ from it:
    the GUI has answered what was just done to it. Returns the screen."""
    deadline, last, since = time.monotonic() + timeout, None, None
    before = None if changed_from is None else hashlib.sha1(changed_from.tobytes()).digest()
    while time.monotonic() < deadline:
        if gui.poll() is not None:
            raise UserError(f"The Nsight Systems GUI ended (exit status {gui.returncode}) before it drew the "
                            f"report: {log_tail(log)}")
        screen, cpu = read_framebuffer(framebuffer), session_cpu_seconds(gui.pid)
        digest = hashlib.sha1(screen.tobytes()).digest()
        if digest == before:  # not redrawn yet
            last = None
        elif last is None or digest != last[0] or cpu - last[1] > 0.05 * QUIET_SECONDS:
            last, since = (digest, cpu), time.monotonic()
        elif time.monotonic() - since >= QUIET_SECONDS:
            return screen
        time.sleep(0.5)
    raise UserError(f"The Nsight Systems GUI was still busy (drawing, or using the CPU) after {timeout:g} s. "
                    f"Try a larger --timeout. Its output: {log_tail(log)}")


def main_window(display, gui, timeout, log):
    """The id of the GUI's main window (titled "NVIDIA Nsight Systems <version>") once it is shown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gui.poll() is not None:
            raise UserError(f"The Nsight Systems GUI ended (exit status {gui.returncode}) before it opened a "
                            f"window: {log_tail(log)} {INSTALL_HINT}.")
        found = xdotool(display, "search", "--onlyvisible", "--name", r"^NVIDIA Nsight Systems [0-9]")
        if found:
            return found[0]
        time.sleep(0.5)
    raise UserError(f"The Nsight Systems GUI opened no main window within {timeout:g} s: {log_tail(log)}")


def dialogs(display, window):
    """The titles of the GUI's other visible windows: a question or an error shown over the report."""
    shown = xdotool(display, "search", "--onlyvisible", "--classname", "nsys-ui.bin")
    return [" ".join(xdotool(display, "getwindowname", other)) for other in shown if other != window]


def splitter_row(screen):
    """The y of the bar between the timeline and the events view below it (None if there is none): the first
    rows of SPLITTER_GREY across the report's pane, in the middle half of the screen."""
    height, width = screen.shape[:2]
    band = screen[:, int(0.3 * width):int(0.95 * width)]
    share = (band == np.array(SPLITTER_GREY, dtype=np.uint8)).all(axis=-1).mean(axis=1)
    rows = [y for y in range(height // 4, 3 * height // 4) if share[y] > 0.9]
    return rows[0] + 1 if rows else None


def log_tail(log):
    with open(log, errors="replace") as f:
        return f.read().strip()[-800:] or "(nothing)"


@contextlib.contextmanager
def gui_session(gui, report, display, home):
    """``gui report`` on ``display``, in a process group of its own and with ``home`` for its settings; ended
    (the launcher, the crash reporter and the GUI) on leaving."""
    version = gui_version(gui)
    settings = os.path.join(home, ".config", "NVIDIA Corporation")
    os.makedirs(settings, exist_ok=True)
    if version:
        with open(os.path.join(settings, "NVIDIA Nsight Systems.ini"), "w") as f:
            f.write(FIRST_START_SETTINGS.format(version=version))
    runtime = os.path.join(home, "runtime")
    os.makedirs(runtime, mode=0o700, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("QT_", "XDG_"))}
    environment.update(DISPLAY=display, HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"),
                       XDG_RUNTIME_DIR=runtime, QT_QPA_PLATFORM="xcb")
    log = os.path.join(home, "gui.log")
    with open(log, "w") as output:
        process = subprocess.Popen([gui, os.path.abspath(report)], env=environment, stdout=output,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield process, log
    finally:
        for sent in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sent)
            try:
                process.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the GUI itself, a child of the launcher
            os.killpg(process.pid, signal.SIGKILL)


def screenshot_report(report, out_path, gui=None, size=SIZE, timeout=120.0):
    """Open ``report`` in the Nsight Systems GUI on a virtual display, wait until its timeline is drawn with
    every row shown, and save the screen as a PNG at ``out_path``. Returns the GUI's path."""
    if not os.path.isfile(report):
        raise UserError(f"{report} does not exist.")
    gui = find_gui(gui)
    check_tools(gui)
    with tempfile.TemporaryDirectory(prefix="nsight-gui-") as scratch:
        with virtual_display(os.path.join(scratch, "screen"), size) as (display, framebuffer), \
                gui_session(gui, report, display, os.path.join(scratch, "home")) as (process, log):
            window = main_window(display, process, timeout, log)
            xdotool(display, "windowmove", window, "0", "0")
            xdotool(display, "windowsize", window, str(size[0]), str(size[1]))
            screen = wait_until_quiet(process, framebuffer, timeout, log)
            shown = dialogs(display, window)
            if shown:
                raise UserError(f"The Nsight Systems GUI shows a window over the report: {'; '.join(shown)}. "
                                "Open the report in the GUI once by hand to see what it asks.")
            edge = splitter_row(screen)
            if edge is not None:  # the timeline's lower edge, dragged down: the events view below is empty
                x = str(size[0] * 2 // 3)
                xdotool(display, "mousemove", x, str(edge), "sleep", "0.2", "mousedown", "1", "sleep", "0.2",
                        "mousemove", x, str(size[1] // 2), "sleep", "0.2", "mousemove", x, str(size[1] - 20),
                        "sleep", "0.2", "mouseup", "1", "mousemove", str(size[0] - 10), "5")
                screen = wait_until_quiet(process, framebuffer, timeout, log, changed_from=screen)
    write_png(screen, out_path)
    return gui


def write_png(screen, path):
    """``screen`` as a PNG at ``path``, in 256 colours when that loses nothing visible (the GUI's flat colours)."""
    from PIL import Image

    image = Image.fromarray(screen)
    if len(np.unique(screen.reshape(-1, 3), axis=0)) > 256:
        image = image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path, suffix=".png") as temporary:
        image.save(temporary, optimize=True)


def image_name(report):
    """``nsys_gui_<folder>_<report>.png``: sample_nsys_profiles/cpu/baseline.nsys-rep ->
    nsys_gui_sample_nsys_profiles_cpu_baseline.png (``make figures``' timeline of it is nsys_<same>.png)."""
    from figures.tutorial_images import profile_tag

    stem = os.path.basename(report)[:-len(".nsys-rep")] if report.endswith(".nsys-rep") else os.path.basename(report)
    return f"nsys_gui_{profile_tag(os.path.dirname(os.path.abspath(report)))}_{stem}.png"


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="*", default=[DEFAULT_REPORT],
                        help=f"the .nsys-rep reports to open (default: {os.path.relpath(DEFAULT_REPORT, ROOT)})")
    parser.add_argument("--out_dir", default=DEFAULT_OUT_DIR, help="where the PNGs go (default: tutorial_images/)")
    parser.add_argument("--gui", default=None, help=f"the nsys-ui to run (default: ${GUI_VARIABLE}, else the first "
                                                    "found: PATH, beside nsys, /opt/nvidia, Debian's unpacked)")
    parser.add_argument("--size", default=f"{SIZE[0]}x{SIZE[1]}",
                        help="the window, WIDTHxHEIGHT (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each stage")
    args = parser.parse_args(argv)
    try:
        size = tuple(int(side) for side in args.size.lower().split("x"))
    except ValueError:
        size = ()
    if len(size) != 2 or min(size) < 400:
        raise UserError(f"--size {args.size}: expected WIDTHxHEIGHT, each at least 400, e.g. 1600x1000.")

    gui = find_gui(args.gui)  # before starting anything: a missing GUI is the likeliest mistake
    check_tools(gui)
    for report in args.reports:
        out = os.path.join(args.out_dir, image_name(report))
        screenshot_report(report, out, gui, size, args.timeout)
        print(f"Wrote {out} ({report} in {gui}, Nsight Systems {gui_version(gui) or 'of unknown version'})")


if __name__ == "__main__":
    main()
