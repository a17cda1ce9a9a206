"""A temp folder of the check's own for everything it starts (TMPDIR), removed when the
check ends: what the programs leave in a temp folder (ddprun's flight-recorder and log
folders after a killed run, torchrun's torchelastic_* folders) does not outlive it."""
import atexit
import os
import shutil
import tempfile


def use():
    folder = tempfile.mkdtemp(prefix="ddp-check-")
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # Python's own temp files follow TMPDIR too
    atexit.register(shutil.rmtree, folder, True)
    return folder
