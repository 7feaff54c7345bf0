"""Build a folder under a temporary name, then rename it into place: all of it or none of it.

The store's ``register``, ``aieng model convert`` and ``aieng demo build`` all write a folder
that must never be seen half-written (a crash, Ctrl-C or a full disk mid-copy would otherwise
leave something that looks like a model). They share this one copy of the pattern, because
the details drift when repeated: the temp folder must sit beside the target (same filesystem,
so the rename is atomic), the target must be re-checked at the moment of the rename (someone
may have created it while we worked), and the temp folder must go on *any* failure, Ctrl-C
included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def occupied(target: Path, *, replace_empty: bool = True) -> bool:
    """True when publishing to ``target`` would replace something that is there.

    An empty directory is free (a user may create ``--out`` first) unless ``replace_empty`` is
    False. A symlink always counts as taken: renaming over it would not replace what it points to.
    """
    target = Path(target)
    if target.is_symlink():
        return True
    if not target.exists():
        return False
    if not replace_empty or not target.is_dir():
        return True
    return any(target.iterdir())


def _default_error(target: Path) -> BaseException:
    return FileExistsError(f"{target} already exists and is not empty")


@contextlib.contextmanager
def staged_directory(
    target: Path | str,
    *,
    tmp_name: str | None = None,
    lock: contextlib.AbstractContextManager | None = None,
    exists_error: Callable[[Path], BaseException] = _default_error,
    replace_empty: bool = True,
) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target``; publish it as ``target`` on success.

    - ``tmp_name``: the temporary folder's name in ``target``'s parent (default
      ``.<target name>.tmp-<random>``; hidden, so listings skip it). Callers that clean up
      after dead builds encode what they need (host, pid) in it.
    - ``lock``: a context manager held around the final check and rename (the store's per-model
      ``flock``), so two writers racing for one target cannot both win.
    - ``exists_error``: builds the exception raised when ``target`` is taken (see ``occupied``),
      on entry (before any work) and again just before the rename.
    - ``replace_empty``: whether an existing empty directory may be replaced.

    On normal exit the folder is fsynced, renamed over ``target`` (POSIX ``rename`` replaces an
    empty directory atomically) and the parent is fsynced, so the new name survives a power cut.
    On any exception, ``BaseException`` included, the temporary folder is removed and ``target``
    is left as it was.
    """
    target = Path(target)
    if occupied(target, replace_empty=replace_empty):
        raise exists_error(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / (tmp_name or f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        with lock if lock is not None else contextlib.nullcontext():
            if occupied(target, replace_empty=replace_empty):  # created while we worked
                raise exists_error(target)
            os.rename(tmp, target)
            fsync_dir(parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename or a new file in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def owned_name(prefix: str) -> str:
    """A temporary name that records who made it: ``<prefix><host>-<pid>-<random>``.

    A process killed by SIGKILL (or a power cut) runs no cleanup; the next writer finds its
    leftovers by prefix and removes them once it sees that pid is gone (``remove_dead``).
    """
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_dead(parent: Path, prefix: str) -> list[Path]:
    """Delete the ``owned_name(prefix)`` files and folders in ``parent`` whose process is gone.

    Only this host's names are judged (another host may share the disk and be alive); a live
    pid, ours included, is left alone. Returns what was removed, for the log.
    """
    removed = []
    host = socket.gethostname()
    for path in Path(parent).glob(prefix + "*"):
        parts = path.name[len(prefix) :].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, someone else's
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed
