"""``strata serve`` (declared by the engine: ``strata_serve::config::ServeOptions``) and
``strata serve status``."""

from __future__ import annotations

from .. import _native
from .schema import native_section, option, section

ServeConfig = native_section("serve", "ServeConfig")


@section("serve.status")
class ServeStatusConfig:
    address: str = option("127.0.0.1:7100", help="HOST:PORT of the server")
    token: str = option("", help="shared secret (default $STRATA_SERVE_TOKEN)")
    timeout: float = option(10.0, help="seconds to wait for the answer")

    def check(self) -> None:
        _native.config_check_address("serve.status", "address", self.address)
