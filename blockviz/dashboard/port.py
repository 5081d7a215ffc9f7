"""`python -m blockviz.dashboard.port PORT`: can the app be served on PORT? `make run`
asks before it starts Streamlit, whose own refusal ("Port 8501 is not available") does
not say how to choose another port.

The address is the one `.streamlit/config.toml` gives Streamlit (localhost), and the test
is the bind Streamlit makes: a socket of that address's family with SO_REUSEADDR, so a
port that only lingers after a closed server counts as free, as it does for Streamlit.
"""

from __future__ import annotations

import errno
import socket
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

STREAMLIT_CONFIG = Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml"
EXIT_TAKEN = 1


def served_address(config: Path = STREAMLIT_CONFIG) -> str:
    """The address Streamlit serves on: server.address of its config (localhost without)."""
    try:
        settings = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return "localhost"
    return str(settings.get("server", {}).get("address") or "localhost")


def port_problem(port_text: str, address: str) -> str | None:
    """Why the app cannot be served on `port_text` at `address`, in one line that says
    how to choose another port; None when it can."""
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        return (
            f"PORT={port_text!r} is not a port number; give one from 1024 to 65535: "
            "make run PORT=8502"
        )
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            other = 8502 if port != 8502 else 8503
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {address} is taken (is blockviz already served at "
                    f"http://{address}:{port}?); serve this one on another port: "
                    f"make run PORT={other}"
                )
            return (
                f"cannot serve on port {port} of {address} ({exc.strerror}); "
                f"choose another port: make run PORT={other}"
            )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when the port given is free here, else print why (and what to type) and
    exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    problem = port_problem(args[0] if args else "8501", served_address())
    if problem is None:
        return 0
    print(f"blockviz: {problem}", file=sys.stderr)
    return EXIT_TAKEN


if __name__ == "__main__":
    sys.exit(main())
