"""What the Nsight Systems tests need: an nsys, Debian's 2022.4 unpacked by benchmarks/nsight.py where the
machine has none.

CI runs the suite as root on a fresh machine, so a missing nsys is fetched there from Debian's non-free
component (about 170 MB, unpacked under ~/.cache; neither root nor a GPU is needed to run it, root is
the sign of a machine set up for the suite, as for Slurm). Elsewhere the tests are skipped with the
command that installs it, except under CI (``CI`` set), where a skip would hide that they never ran.
"""
import os
import shutil

from conftest import unavailable
from benchmarks import nsight
from utils.errors import UserError


def ensure_nsys():
    """The path of an nsys to run: the machine's, or Debian's 2022.4, fetched and unpacked when root."""
    found = nsight.find_nsys()
    if found:
        return found
    if os.geteuid() != 0 or not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        unavailable("no nsys here (PATH, /opt/nvidia, /usr/local/cuda); `python -m benchmarks.nsight install` "
                    "unpacks Debian's Nsight Systems 2022.4 (about 170 MB) where this suite looks for it")
    try:
        return nsight.install()
    except UserError as error:
        unavailable(f"Debian's Nsight Systems could not be installed: {error}")
