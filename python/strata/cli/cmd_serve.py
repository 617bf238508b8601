"""``strata serve`` and ``strata serve status``."""

from __future__ import annotations

import json

from ..config import from_args
from ..config.serve import ServeConfig, ServeStatusConfig
from .common import add_section_command


def register(sub, name: str, help: str) -> None:
    s = add_section_command(
        sub,
        name,
        ServeConfig,
        run_serve,
        output_flags=False,
        help=help,
        description="Serves registered graphs and models over gRPC (proto/strata/serve/v1/serve.proto; see "
        "docs/serve.md): registration, durable mutations, and analyses (embeddings, classes, link scores) computed "
        "next to the data. Stores given as arguments are registered at start. Prints 'listening on HOST:PORT' "
        "(flushed) once ready; SIGTERM drains in-flight requests, then exits 0 with a summary line.",
    )
    s.add_argument("--json-summary", action="store_true", help="print the final summary as JSON on stdout")


def register_status(sub, name: str, help: str) -> None:
    st = add_section_command(
        sub,
        name,
        ServeStatusConfig,
        run_status,
        output_flags=False,
        help=help,
        description="Prints a running server's registered graphs and models, cache hit rates and queue depth.",
    )
    st.prog = "strata serve status"
    st.add_argument("--json", action="store_true", help="print the status as JSON")


def run_serve(args) -> int:
    from ..serve.server import format_stop, serve

    info = serve(from_args(ServeConfig, args))
    print(json.dumps(info, indent=2) if args.json_summary else format_stop(info), flush=True)
    return 0


def run_status(args) -> int:
    from ..serve.client import Client
    from ..serve.server import format_status

    cfg = from_args(ServeStatusConfig, args)
    with Client(cfg.address, token=cfg.token or None, token_file=cfg.token_file, timeout=cfg.timeout) as client:
        status = client.status()
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
