"""`make run` on a port already taken (a second app, say) says how to choose another,
rather than Streamlit's bare "Port 8501 is not available" (issue 35)."""

from __future__ import annotations

import re
import socket

import pytest

from blockviz.dashboard import port
from tests.helpers import ROOT


def test_a_taken_port_says_how_to_choose_another(capsys):
    with socket.socket() as server:
        server.bind(("localhost", 0))
        server.listen()
        taken = server.getsockname()[1]
        assert port.main([str(taken)]) == port.EXIT_TAKEN
    err = capsys.readouterr().err
    assert f"port {taken} on localhost is taken" in err and "make run PORT=8502" in err, err
    assert err.count("\n") == 1


def test_a_free_port_passes():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        free = probe.getsockname()[1]
    assert port.port_problem(str(free), "localhost") is None


@pytest.mark.parametrize("text", ["abc", "0", "70000"])
def test_a_port_that_is_no_number_is_named(text):
    assert f"PORT={text!r} is not a port number" in port.port_problem(text, "localhost")


def test_the_app_is_served_on_localhost_by_default():
    assert port.served_address() == "localhost"


def test_make_run_checks_the_port_and_serves_on_it():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^PORT \?= 8501$", makefile, re.MULTILINE)
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    check, serve = recipe.strip().splitlines()
    assert check.endswith("-m blockviz.dashboard.port $(PORT)"), check
    assert serve.endswith("-m streamlit run app.py --server.port $(PORT)"), serve
