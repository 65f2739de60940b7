"""Files of the user's work that only the user may read: ``.loopd/`` is 0700 and what loopd-es writes there 0600.

The log and the host state hold objectives, transcripts and costs, so other local users must not read them.
Directories loopd-es creates are 0700 and files it creates 0600 (SQLite gives a database's ``-wal`` and
``-shm`` files the database's own mode, so creating the database 0600 covers them). A ``.loopd`` folder left
readable by an older version is tightened, with what is in it, the first time a writer opens it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

PRIVATE_DIR: Final = 0o700
PRIVATE_FILE: Final = 0o600
STATE_DIR: Final = ".loopd"


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents 0700; a ``.loopd`` folder of ours that others can read is tightened.

    :raises OSError: when a directory cannot be created.
    """
    if path.is_dir():
        if path.name == STATE_DIR:
            _tighten(path)
        return
    for folder in reversed((path, *path.parents)):
        if not folder.is_dir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, PRIVATE_DIR)


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 if it is missing, so whatever opens it next keeps it private.

    :raises OSError: when it cannot be created.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        return
    os.close(fd)


def _tighten(root: Path) -> None:
    """Make ``root`` 0700 and the files and folders in it private, when ``root`` is ours and others can read it."""
    st = os.lstat(root)
    if st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return
    with contextlib.suppress(OSError):
        os.chmod(root, PRIVATE_DIR)
        for folder, dirs, files in os.walk(root):
            for name in (*dirs, *files):
                item = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    mode = os.lstat(item)
                    if mode.st_uid == os.getuid() and mode.st_mode & 0o077:
                        if stat.S_ISDIR(mode.st_mode):
                            os.chmod(item, PRIVATE_DIR)
                        elif stat.S_ISREG(mode.st_mode):
                            os.chmod(item, PRIVATE_FILE)
