"""Start TensorBoard over a log directory, on a free localhost port, and wait until it answers.

Why a module and not a shell line: start_tensorboard.ipynb (on any JupyterHub) and
``python -m figures.tensorboard_screenshot`` both need a TensorBoard that is really serving before
they print a URL or open a browser, on a port nobody else holds, and stoppable later by its pid,
even from another process. Keeping that here lets the tests call it directly.

    from utils.tensorboard_launch import default_logdir, start_tensorboard
    server = start_tensorboard(default_logdir())
    print(server.describe())
    server.stop()            # or, from anywhere: stop_tensorboard(pid)

TensorBoard runs as ``sys.executable -m tensorboard.main``, the TensorBoard of the current Python
environment whatever is on PATH, with ``--port 0`` so that the operating system picks a free
port, which TensorBoard then records in its info file (``tensorboard.manager``, the same record
the ``%tensorboard`` notebook magic reads). Nothing has to guess a port that might be taken.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from utils.errors import UserError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGDIR_VARIABLE = "TENSORBOARD_LOGDIR"
SCRATCH_LOGS = ("sc22-dl-tutorial", "logs")  # below $SCRATCH: submit_pm.sh's default LOG_DIR
HOST = "127.0.0.1"  # localhost only: the JupyterHub proxy or an SSH tunnel reaches it from outside


def open_local(url, timeout=10):
    """urlopen for a localhost URL, ignoring http_proxy settings meant for the outside world."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout)


def default_logdir(environ=None):
    """Where the runs are: ``$TENSORBOARD_LOGDIR`` if set; else, where ``$SCRATCH`` is set and the
    directory exists, ``$SCRATCH/sc22-dl-tutorial/logs``, where submit_pm.sh writes them (as the
    original tutorial's notebook reads them); else ``runs`` in the repository, train.py's default."""
    environ = os.environ if environ is None else environ
    if environ.get(LOGDIR_VARIABLE):
        return os.path.abspath(environ[LOGDIR_VARIABLE])
    scratch_logs = os.path.join(environ.get("SCRATCH") or "/nonexistent", *SCRATCH_LOGS)
    if environ.get("SCRATCH") and os.path.isdir(scratch_logs):
        return os.path.abspath(scratch_logs)
    return os.path.join(REPO_ROOT, "runs")


def jupyterhub_proxy_url(port, environ=None):
    """The path under which JupyterHub's server proxy forwards to ``port``, or None outside JupyterHub.

    JupyterHub sets ``JUPYTERHUB_SERVICE_PREFIX`` (e.g. ``/user/alice/``) in the single-user server
    and its kernels; jupyter-server-proxy serves localhost ports under ``<prefix>proxy/<port>/``.
    The trailing slash matters: TensorBoard loads its assets with relative URLs.
    """
    environ = os.environ if environ is None else environ
    prefix = environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix:
        return None
    return f"{environ.get('JUPYTERHUB_HOST', '')}{prefix.rstrip('/')}/proxy/{port}/"


@dataclass
class TensorBoardServer:
    """A running TensorBoard: where it serves, and the process to stop."""
    pid: int
    port: int
    logdir: str
    output_path: str  # TensorBoard's own messages, for when something goes wrong

    @property
    def url(self):
        return f"http://{HOST}:{self.port}/"

    def describe(self):
        """Lines for a person: what is served where, how to reach it and how to stop it."""
        lines = [f"TensorBoard (pid {self.pid}) serves {self.logdir} at {self.url}"]
        proxy = jupyterhub_proxy_url(self.port)
        if proxy:
            lines.append(f"Through JupyterHub, open: {proxy}")
        lines.append(f"Stop it with: kill {self.pid}   (its messages: {self.output_path})")
        return "\n".join(lines)

    def stop(self, timeout=10.0):
        stop_tensorboard(self.pid, timeout)


def start_tensorboard(logdir, timeout=60.0, extra_args=()):
    """Start TensorBoard over ``logdir`` and return once it answers HTTP; a UserError if it cannot.

    The process gets a session of its own, so it outlives the notebook kernel or shell that
    started it (as a TensorBoard started from a notebook should) and a Ctrl-C there does not
    reach it; stop it with :func:`stop_tensorboard`.
    """
    logdir = os.path.abspath(logdir)
    if not os.path.isdir(logdir):
        raise UserError(f"The TensorBoard log directory {logdir} does not exist. Train first (python train.py "
                        f"--config=demo writes under runs/), or set {LOGDIR_VARIABLE} to a directory of runs.")
    output = tempfile.NamedTemporaryFile("w", prefix="tensorboard-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", HOST, "--port", "0",
               *extra_args]
    with output:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        port = _wait_for_port(process, output.name, deadline)
        server = TensorBoardServer(process.pid, port, logdir, output.name)
        _wait_until_serving(process, output.name, server.url, deadline)
    except BaseException:
        stop_tensorboard(process.pid)
        raise
    return server


def _wait_for_port(process, output_path, deadline):
    """The port TensorBoard bound, read from the info file it writes once it serves."""
    from tensorboard import manager

    while time.monotonic() < deadline:
        for info in manager.get_all():
            if info.pid == process.pid:
                return info.port
        _check_running(process, output_path)
        time.sleep(0.2)
    raise _timeout_error(process, output_path)


def _wait_until_serving(process, output_path, url, deadline):
    while time.monotonic() < deadline:
        try:
            with open_local(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # URLError included: not listening yet, or busy starting
            pass
        _check_running(process, output_path)
        time.sleep(0.2)
    raise _timeout_error(process, output_path)


def _check_running(process, output_path):
    if process.poll() is not None:
        raise UserError(f"TensorBoard exited with status {process.returncode} before serving. Its last "
                        f"messages ({output_path}):\n{_tail(output_path)}")


def _timeout_error(process, output_path):
    return UserError(f"TensorBoard (pid {process.pid}) did not answer in time; a very large log directory "
                     f"takes a while to index. Its last messages ({output_path}):\n{_tail(output_path)}")


def _tail(path, lines=15):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def stop_tensorboard(pid, timeout=10.0):
    """Stop the TensorBoard with process id ``pid`` (and its data-server child); wait until it is gone.

    Refuses a pid that is not a TensorBoard, so a stale pid never ends an unrelated process.
    """
    if not is_running(pid):
        return
    if not _is_tensorboard(pid):
        raise UserError(f"Process {pid} is not a TensorBoard; not stopping it.")
    for signum in (signal.SIGTERM, signal.SIGKILL):  # TensorBoard exits cleanly on SIGTERM
        _send(pid, signum)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(pid)
            if not is_running(pid):
                return
            time.sleep(0.1)
    raise UserError(f"TensorBoard (pid {pid}) is still running after SIGKILL.")


def _send(pid, signum):
    """Signal the process, and its whole group when it leads one (start_tensorboard's do)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reap(pid):
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_running(pid):
    """True while process ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): trust kill(0)


def _is_tensorboard(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"tensorboard" in f.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc")  # no /proc to check with (macOS): trust the caller
    except OSError:
        return False


if __name__ == "__main__":  # a library module: `python -m ... --help` (or any use) says what it is
    print(__doc__.strip())
    print(f"\n{__spec__.name} has no command line of its own; it is imported (see above).")
    sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
