"""Output files: the project's one atomic writer, and the check a command runs on its `-o` path
before any long work.

`write_atomic(path, text)` leaves `path` holding the old content or the new, never half of
either, and never replaces anything but a regular file:

- the text goes to an anonymous file in the target's folder (Linux `O_TMPFILE`: it has no name,
  so a process killed while writing leaves nothing behind), which is then given a unique
  temporary name (`.<name>.<random>.tmp`) and renamed over the target. Where `O_TMPFILE` is not
  available the file is created under the temporary name at once; every failure that reaches
  Python (an exception, Ctrl-C) removes it;
- a symbolic link is written through: the file at the end of the chain of links is replaced
  and the links stay;
- a path that exists and is not a regular file (a folder, FIFO, device such as /dev/full, or
  socket) is refused and left untouched;
- the new file has the permissions of any new file (0666 less the umask), and its data is
  flushed to the disk (fsync) before the rename.

Every refusal and every system error is a ValueError naming the path given, the rule or the
system's reason, and the fix.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_TEMP_TRIES = 100
"""Random names tried before giving up (48 random bits each: a clash is already unlikely)."""
_TEMP_NAME_CHARS = 100
"""Characters of the target's name kept in a temporary name (the rest is cut, so that a long
but valid name still has a valid temporary name)."""
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EXDEV}
"""Errors of `O_TMPFILE` (or of linking its file into the folder) that mean "not supported
here" (old kernels, some file systems, no /proc): the writer falls back to a named file."""


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (see the module docstring). ValueError when
    `path` is empty, its folder does not exist, it names something other than a regular file,
    or the system refuses the write."""
    data = text.encode("utf-8")  # an unencodable text fails before any file is made
    target = resolve_target(path)
    try:
        fd, tmp = _open_temp(target)
        try:
            with os.fdopen(fd, "wb") as fh:
                _write_all(fh.fileno(), data)
                if tmp is None:
                    tmp = _link_anonymous(fh.fileno(), target)
            if tmp is None:  # the anonymous file could not be linked (no /proc): a named one
                fd, tmp = _open_named(target)
                with os.fdopen(fd, "wb") as fh:
                    _write_all(fh.fileno(), data)
            os.replace(tmp, target)
            tmp = None
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise ValueError(_system_refused(path, exc)) from None


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, then flushed to the disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail now, not after a long search or trace, when `write_atomic(path, ...)` would be
    refused: the same checks, plus making (and removing) a temporary file in the folder. The
    target is not touched."""
    target = resolve_target(path)
    tmp: Path | None = None
    try:
        fd, tmp = _open_temp(target)
        os.close(fd)
    except OSError as exc:
        raise ValueError(_system_refused(path, exc)) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def resolve_target(path: str | os.PathLike[str]) -> Path:
    """The file `write_atomic(path, ...)` replaces: `path`, or the end of its chain of symbolic
    links. ValueError when the path is empty, its folder is missing, or it exists and is not a
    regular file."""
    name = os.fspath(path)
    if not name.strip() or "\x00" in name:
        raise ValueError(
            f"the output path {name!r} is empty or holds a NUL byte; give a file name, e.g. "
            "-o plan.json"
        )
    try:
        target = Path(os.path.realpath(name)) if os.path.islink(name) else Path(name)
        folder = target.parent
        if not folder.is_dir():
            raise ValueError(
                f"cannot write {name!r}: folder {str(folder)!r} does not exist; create it "
                "first or choose another path"
            )
        try:
            mode: int | None = os.stat(target).st_mode
        except FileNotFoundError:
            mode = None
    except OSError as exc:
        raise ValueError(_system_refused(path, exc)) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(
            f"cannot write {name!r}: it exists and is not a regular file (a folder, FIFO or "
            "device is never replaced); remove it or choose another path"
        )
    return target


def _system_refused(path: str | os.PathLike[str], exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return (
        f"cannot write {os.fspath(path)!r}: {reason}; choose a path in a folder you can write "
        "to, with a shorter name if it is long"
    )


def _open_temp(target: Path) -> tuple[int, Path | None]:
    """An open file for the new content in the target's folder: anonymous (`O_TMPFILE`,
    returned with None) where the system has it, else created under a unique temporary name.
    The file is made with mode 0666 and the kernel applies the umask (unlike
    `tempfile.mkstemp`, which makes 0600 files)."""
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            flags = os.O_WRONLY | tmpfile | getattr(os, "O_CLOEXEC", 0)
            return os.open(target.parent, flags, 0o666), None
        except OSError as exc:
            if exc.errno not in _NO_TMPFILE:
                raise
    return _open_named(target)


def _open_named(target: Path) -> tuple[int, Path]:
    """A new file under a unique temporary name next to `target`, open for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_TRIES):
        tmp = _temp_name(target)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(target.parent))


def _temp_name(target: Path) -> Path:
    return target.parent / f".{target.name[:_TEMP_NAME_CHARS]}.{secrets.token_hex(6)}.tmp"


def _link_anonymous(fd: int, target: Path) -> Path | None:
    """Give the anonymous file `fd` a unique temporary name next to `target` (linkat through
    /proc/self/fd, as open(2) describes for O_TMPFILE); None where that is not possible."""
    for _ in range(_TEMP_TRIES):
        tmp = _temp_name(target)
        try:
            os.link(f"/proc/self/fd/{fd}", tmp, follow_symlinks=True)
            return tmp
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno in _NO_TMPFILE:
                return None
            raise
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(target.parent))
