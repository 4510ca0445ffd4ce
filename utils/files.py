"""Files written so that an interruption never leaves half of one under the final name."""
import contextlib
import os


@contextlib.contextmanager
def atomic_path(path, suffix=""):
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block succeeds.

        with atomic_path("run/checkpoint.pt") as temporary:
            torch.save(state, temporary)

    The temporary file sits in the same directory (a rename within one file system is atomic) under
    a hidden name with the usual permissions; ``suffix`` is for writers that choose the format by
    the extension (``".png"``). Its data reach the disk before the rename makes it the file, so a
    crash at any moment leaves the old file or the new one, never a mix; if the block fails, the
    temporary file is removed and ``path`` is untouched.
    """
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp{suffix}")
    try:
        yield temporary
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
