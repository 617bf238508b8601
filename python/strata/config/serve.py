"""``strata serve`` (declared by the engine: ``strata_serve::config::ServeOptions``) and
``strata serve status``."""

from __future__ import annotations

from pathlib import Path

from .. import _native
from ..errors import ConfigError
from ..units import check_seconds
from .schema import native_section, option, section

#: The help of every ``--token-file``.
TOKEN_FILE_HELP = (
    "file holding the shared secret on one line (read once; a trailing newline is dropped): unlike --token, "
    "not visible in ps"
)
#: The help of every ``--token``.
TOKEN_HELP = (
    "shared secret (default: --token-file, else $STRATA_SERVE_TOKEN); visible to every user of this machine in "
    "ps, so prefer --token-file or the environment"
)


class _ServeFrontEnd:
    """The [serve] option Python handles before the server starts: where the token is read from."""

    token_file: Path | None = option(None, help=TOKEN_FILE_HELP)


ServeConfig = native_section("serve", "ServeConfig", front=_ServeFrontEnd)


@section("serve.status")
class ServeStatusConfig:
    address: str = option("127.0.0.1:7100", help="HOST:PORT of the server")
    token: str = option("", help=TOKEN_HELP)
    token_file: Path | None = option(None, help=TOKEN_FILE_HELP)
    timeout: float = option(10.0, help="seconds to wait for the answer")

    def check(self) -> None:
        _native.config_check_address("serve.status", "address", self.address)
        try:
            check_seconds(self.timeout)
        except ValueError as e:
            raise ConfigError(f"serve.status.timeout: {e}") from None
