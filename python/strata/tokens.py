"""The shared secret of Strata's network services (``strata serve``, ``strata farmem serve``):
where a server or a client finds its token. Tokens are compared by the services themselves
(``strata_store::secret``)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from .errors import ConfigError

#: Longest token file read: a token is one short line, and the file may be anything (a pipe,
#: a device) until it is read. The services accept no longer token.
TOKEN_FILE_MAX = 4096


def resolve_token(token: str | None, token_file: str | os.PathLike | None, env: str) -> str | None:
    """The shared-secret token: the one line of ``token_file`` (read once, its trailing newline
    stripped; a warning on stderr when other users may read the file), else ``token`` (``""``:
    none), else the environment variable ``env``; None when there is none. ``token`` and
    ``token_file`` together are a :class:`ConfigError`, as is a token file that is missing,
    empty, or not one line of at most :data:`TOKEN_FILE_MAX` bytes."""
    if token_file:
        if token:
            raise ConfigError("give the token by --token or by --token-file, not both")
        return _read_token_file(Path(token_file))
    if token is not None:
        return token or None
    return os.environ.get(env) or None


def _read_token_file(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(TOKEN_FILE_MAX + 1)
    except OSError as e:
        raise ConfigError(f"token file {path}: cannot be read: {e.strerror}") from None
    if stat.S_ISREG(mode) and mode & 0o077:
        print(
            f"warning: token file {path} can be read by other users (mode {stat.S_IMODE(mode):03o}); chmod 600 {path}",
            file=sys.stderr,
        )
    if len(data) > TOKEN_FILE_MAX:
        raise ConfigError(f"token file {path}: longer than {TOKEN_FILE_MAX} bytes; a token file holds one line")
    token = data.decode("ascii", errors="replace").removesuffix("\n").removesuffix("\r")
    # The serve token travels in an HTTP header: visible ASCII only (and no secret is echoed here).
    if not token or not all("!" <= c <= "~" for c in token):
        raise ConfigError(f"token file {path}: expected one line of visible ASCII characters (no spaces)")
    return token
