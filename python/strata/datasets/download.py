"""HTTP downloads that resume, checksums, and archive extraction (standard library only).

A download goes to ``FILE.part`` and is renamed to ``FILE`` only once complete: its size matches
what the server announced and its checksum, when the catalogue has one, matches. A later run
finds ``FILE`` and skips it, or finds ``FILE.part`` and asks for the rest with ``Range: bytes=N-``.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .. import __version__
from ..errors import DownloadError, InputError
from ..paths import make_dir
from ..units import fmt_bytes, fmt_duration
from .registry import CHECKSUM_ALGORITHMS

ProgressFn = Callable[..., bool]

CHUNK = 1 << 20
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)")
# HTTP statuses worth another attempt; any other error status is final.
_TRANSIENT = {408, 425, 429, 500, 502, 503, 504}
_MAX_WAIT = 30.0


class _Retry(Exception):
    """A failed attempt that a later one may get past (dropped connection, busy server)."""


def no_progress(*_args) -> bool:
    """A progress sink that shows nothing."""
    return True


def part_path(dest: Path) -> Path:
    """Where the incomplete download of ``dest`` is kept: ``dest`` + ``.part``."""
    return dest.with_name(dest.name + ".part")


def download(
    url: str,
    dest: Path,
    *,
    checksum: str | None = None,
    timeout: float = 60.0,
    retries: int = 3,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> bool:
    """Downloads ``url`` to ``dest`` unless ``dest`` is already there; returns whether it transferred.

    An interrupted transfer is resumed, by this call (up to ``retries`` more attempts, waiting 1, 2,
    4 ... s) or by a later one. ``timeout`` is in seconds per network operation. ``checksum``
    (``sha256:HEX`` or ``md5:HEX``) is checked before the rename; on a mismatch the file is deleted.
    """
    progress = progress or no_progress
    part = part_path(dest)
    if force:
        dest.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    if dest.exists():
        return False
    make_dir(dest.parent, "--dir")
    attempt = 0
    while True:
        try:
            _attempt(url, part, dest.name, timeout, progress)
            break
        except _Retry as e:
            kept = part.stat().st_size if part.exists() else 0
            if attempt >= retries:
                resume = f"; {fmt_bytes(kept)} kept in {part}, run again to resume" if kept else ""
                tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                raise DownloadError(f"GET {url}: {e} (gave up after {tries}{resume})") from None
            wait = min(2.0**attempt, _MAX_WAIT)
            progress("message", f"{dest.name}: {e}; retrying in {fmt_duration(wait)}")
            time.sleep(wait)
            attempt += 1
    if checksum:
        verify(part, checksum, dest.name, progress)
    part.replace(dest)
    return True


def _attempt(url: str, part: Path, name: str, timeout: float, progress: ProgressFn) -> None:
    """One request: appends to ``part`` on 206, restarts it on 200; raises _Retry when cut short."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": f"strata/{__version__}"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and have:
            # Nothing left to send: the part is complete if it has the whole size, else stale.
            total = _content_range(e.headers.get("Content-Range"))[1]
            if total == have:
                return
            part.unlink()
            raise _Retry(f"the server refused to resume at byte {have:,}; starting over") from None
        if e.code in _TRANSIENT:
            raise _Retry(f"HTTP {e.code} {e.reason}") from None
        raise DownloadError(f"GET {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise _Retry(f"cannot reach the server ({getattr(e, 'reason', e)})") from None
    with response:
        if response.status == 206:
            start, total = _content_range(response.headers.get("Content-Range"))
            if start != have:
                part.unlink()
                raise _Retry(f"the server resumed at byte {start} instead of {have:,}; starting over")
            mode = "ab"
            progress("message", f"{name}: resuming at {fmt_bytes(have)}")
        else:
            if have:
                progress("message", f"{name}: the server does not resume downloads; starting over")
            have, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        progress("stage", f"get {name}", total - have if total is not None else 0, 0)
        got = _copy(response, part, mode, progress)
    if total is not None and have + got != total:
        raise _Retry(f"the connection closed after {fmt_bytes(have + got)} of {fmt_bytes(total)}")


def _copy(response: BinaryIO, part: Path, mode: str, progress: ProgressFn) -> int:
    """Streams the body into ``part``; returns the bytes written. What arrived before a failure
    stays in ``part`` for the next attempt."""
    got = 0
    with part.open(mode) as out:
        while True:
            try:
                chunk = response.read(CHUNK)
            except (http.client.HTTPException, OSError) as e:
                raise _Retry(f"the connection broke after {fmt_bytes(got)} ({e})") from None
            if not chunk:
                return got
            out.write(chunk)
            got += len(chunk)
            progress("update", 0, got)


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total bytes) of a ``Content-Range`` header; None where absent or ``*``."""
    m = _CONTENT_RANGE.match(value or "")
    if not m:
        return None, None
    start, total = m.groups()
    return int(start) if start else None, int(total) if total != "*" else None


def file_digest(path: Path, algorithm: str, progress: ProgressFn | None = None) -> str:
    """Hex digest (``sha256`` or ``md5``) of a file, read in 1 MiB chunks."""
    progress = progress or no_progress
    h = hashlib.new(algorithm)
    progress("stage", f"{algorithm} {path.name.removesuffix('.part')}", path.stat().st_size, 0)
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            progress("update", 0, done)
    return h.hexdigest()


def parse_checksum(checksum: str) -> tuple[str, str]:
    """``("sha256", hex)`` from ``"sha256:HEX"``; ValueError for another algorithm or a malformed digest."""
    algorithm, _, digest = checksum.partition(":")
    digest = digest.lower()
    if CHECKSUM_ALGORITHMS.get(algorithm) != len(digest) or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"expected sha256:<64 hex digits> or md5:<32 hex digits>, got {checksum!r}")
    return algorithm, digest


def verify(path: Path, checksum: str, label: str, progress: ProgressFn | None = None) -> None:
    """Checks ``path`` against ``checksum``; on a mismatch deletes it and raises DownloadError."""
    algorithm, expected = parse_checksum(checksum)
    actual = file_digest(path, algorithm, progress)
    if actual != expected:
        path.unlink()
        raise DownloadError(
            f"{label}: {algorithm} mismatch: expected {expected}, got {actual}; "
            "the file was deleted (run again to download it afresh)"
        )


def is_archive(name: str) -> bool:
    """Whether ``name`` is an archive that fetch extracts (.zip, .tar.gz, .tgz)."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _member_path(dest: Path, name: str, archive: Path, is_dir: bool) -> Path:
    """Where member ``name`` goes under ``dest``; InputError for names that would escape it.
    The archive's root (``./``, which ``tar -C DIR .`` writes first) is ``dest`` itself."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts and is_dir:
        return dest
    if not parts or parts[0] == "/" or ".." in parts or ":" in parts[0]:
        raise InputError(f"{archive}: member {name!r} would be written outside {dest}; refusing to extract")
    return dest.joinpath(*parts)


def extract(archive: Path, dest: Path, progress: ProgressFn | None = None) -> None:
    """Extracts a .zip, .tar.gz or .tgz archive into ``dest``, streaming each member in 1 MiB chunks.

    Members are written under ``dest`` only: absolute names and ``..`` are refused, and links and
    device files in tar archives are skipped.
    """
    progress = progress or no_progress
    try:
        if archive.name.lower().endswith(".zip"):
            _extract_zip(archive, dest, progress)
        else:
            _extract_tar(archive, dest, progress)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        raise InputError(f"{archive}: not a readable archive ({e}); delete it to download it again") from None


def _extract_zip(archive: Path, dest: Path, progress: ProgressFn) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        targets = [_member_path(dest, m.filename, archive, m.is_dir()) for m in members]
        progress("stage", f"extract {archive.name}", sum(m.file_size for m in members), 0)
        done = 0
        for member, target in zip(members, targets, strict=True):
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, target.open("wb") as out:
                done = _pump(src, out, done, progress)


def _extract_tar(archive: Path, dest: Path, progress: ProgressFn) -> None:
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        targets = [_member_path(dest, m.name, archive, m.isdir()) for m in members]
        progress("stage", f"extract {archive.name}", sum(m.size for m in members if m.isfile()), 0)
        done = 0
        for member, target in zip(members, targets, strict=True):
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(member) as src, target.open("wb") as out:
                    done = _pump(src, out, done, progress)
            else:
                progress("message", f"{archive.name}: skipped {member.name} (not a regular file)")


def _pump(src: BinaryIO, out: BinaryIO, done: int, progress: ProgressFn) -> int:
    while chunk := src.read(CHUNK):
        out.write(chunk)
        done += len(chunk)
        progress("update", 0, done)
    return done
