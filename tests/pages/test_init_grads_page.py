"""Gradients at init, the torch-free side: the chart builders, the subprocess helper, the page.

The results here are hand-made with arbitrary values: they test the plumbing and the
wording's arithmetic, not what any init does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config as cfg
from blockviz.dashboard import init_grads
from blockviz.views import charts
from blockviz.views.charts.init_grads import ROW_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")


def made_result(ratios: dict[int, float]) -> dict:
    """A result shaped like `init-grads --json` for init `default`, one seed, given ratios."""
    rows, summary = [], []
    for depth, ratio in ratios.items():
        for position, last in (("post", ratio), ("pre", 1.0)):
            rows += [
                {
                    "init": "default",
                    "norm_position": position,
                    "depth": depth,
                    "seed": 0,
                    "layer": layer,
                    "grad_norm": 2.0 if layer == 0 else last,
                }
                for layer in range(depth)
            ]
        summary.append(
            {
                "init": "default",
                "depth": depth,
                "post_last": ratio,
                "pre_last": 1.0,
                "ratio": ratio,
                "ratio_min": ratio,
                "ratio_max": ratio,
            }
        )
    return {
        "quantity": "ffn.fc_out.weight",
        "dataset": "pydocs",
        "batch_size": 12,
        "block_size": 64,
        "depths": list(ratios),
        "inits": ["default"],
        "seeds": [0],
        "rows": rows,
        "summary": summary,
        "seconds": 0.5,
    }


def test_sentences_are_computed_from_the_numbers() -> None:
    (rising,) = init_grads.ratio_sentences(made_result({2: 1.25, 4: 1.5}))
    assert "1.25× at 2 layers, 1.50× at 4 layers" in rising
    assert "grows with every added depth" in rising
    assert "post-LN first / last = 1.33, pre-LN first / last = 2.00" in rising
    (mixed,) = init_grads.ratio_sentences(made_result({2: 1.25, 4: 1.5, 8: 1.4}))
    assert "does not move in one direction" in mixed
    (falling,) = init_grads.ratio_sentences(made_result({2: 1.5, 4: 1.25}))
    assert "falls with every added depth" in falling
    (level,) = init_grads.ratio_sentences(made_result({2: 0.031, 4: 0.034}))
    assert "rounds to 0.03× at every depth" in level and "(seed means, 1 seed)" in level


def test_profile_chart_averages_seeds_one_line_per_variant() -> None:
    rows = pd.DataFrame(
        [
            {"init": i, "norm_position": p, "depth": d, "seed": s, "layer": la, "grad_norm": 1 + s}
            for i in ("default", "xavier")
            for p in ("pre", "post")
            for d in (2, 3)
            for s in (0, 1)
            for la in range(d)
        ]
    )
    chart = charts.init_grad_profile_chart(rows)
    data = charts.chart_data(chart)
    assert len(data) == 2 * 2 * (2 + 3)  # seeds averaged away
    assert set(data["grad_norm"]) == {1.5}
    assert set(data["variant"]) == {f"{p}-LN, {d} layers" for p in ("pre", "post") for d in (2, 3)}
    spec = chart.to_dict()
    assert spec["facet"]["column"]["field"] == "init"
    assert spec["spec"]["encoding"]["y"]["scale"]["type"] == "log"


def test_ratio_chart_draws_the_summary_and_marks_one() -> None:
    summary = pd.DataFrame(made_result({2: 1.25, 4: 1.5})["summary"])
    chart = charts.init_grad_ratio_chart(summary)
    assert charts.chart_data(chart)["ratio"].tolist() == [1.25, 1.5]
    assert chart.layer[1].data["ratio"].tolist() == [1.0]
    chart.to_dict()


def test_empty_frames_say_no_data() -> None:
    for chart in (
        charts.init_grad_profile_chart(pd.DataFrame(columns=list(ROW_COLUMNS))),
        charts.init_grad_ratio_chart(pd.DataFrame(columns=["init", "depth", "ratio"])),
    ):
        assert charts.NO_DATA in json.dumps(chart.to_dict())


@pytest.fixture
def stub_cli(monkeypatch, tmp_path) -> list[list[str]]:
    """The CLI replaced by a script that prints progress and a made result (no torch)."""
    calls: list[list[str]] = []
    script = tmp_path / "stub.py"
    result = made_result({3: 1.25, 6: 1.5})
    script.write_text(
        "import sys\n"
        "print('progress 0/2 default, pre-LN', file=sys.stderr, flush=True)\n"
        "print('progress 2/2 done', file=sys.stderr, flush=True)\n"
        f"print({json.dumps(json.dumps(result))})\n"
    )

    def command(config_path, depths, inits, n_seeds):
        calls.append([config_path, *map(str, depths), *inits, str(n_seeds)])
        return [sys.executable, str(script)]

    monkeypatch.setattr(init_grads, "command", command)
    monkeypatch.setattr(init_grads, "_CACHE", type(init_grads._CACHE)())
    return calls


def test_measure_reports_progress_and_caches_per_config(stub_cli) -> None:
    seen: list[tuple[int, int, str]] = []
    run_config = cfg.RunConfig()
    first = init_grads.measure(run_config, [3, 6], ["default"], 1, lambda *a: seen.append(a))
    assert seen == [(0, 2, "default, pre-LN"), (2, 2, "done")]
    assert init_grads.measure(run_config, [6, 3], ["default"], 1) is first
    assert init_grads.measure(cfg.replace(run_config, lr=0.1), [3, 6], ["default"], 1) is first
    assert len(stub_cli) == 1  # the learning rate plays no part at initialization
    init_grads.measure(cfg.replace(run_config, d_model=64), [3, 6], ["default"], 1)
    assert len(stub_cli) == 2


def test_a_failed_measurement_raises_its_last_error_line(monkeypatch) -> None:
    monkeypatch.setattr(init_grads, "_CACHE", type(init_grads._CACHE)())
    code = "import sys; print('blockviz init-grads: error: bad', file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(init_grads, "command", lambda *a: [sys.executable, "-c", code])
    with pytest.raises(init_grads.InitGradsError, match="error: bad"):
        init_grads.measure(cfg.RunConfig(), [3], ["default"], 1)


def test_the_page_measures_on_request_and_draws_the_result(stub_cli) -> None:
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.switch_page("pages/init_grads.py").run()
    assert not at.exception
    assert stub_cli == []  # nothing runs at page load
    assert any("Theorem 1" in str(m.value) for m in at.markdown)
    at.multiselect[0].set_value([3, 6])
    at.multiselect[1].set_value(["default"])
    at.number_input[0].set_value(1)
    at.button[0].click().run()
    assert not at.exception and not at.error
    assert len(stub_cli) == 1
    shown = "\n".join(str(m.value) for m in at.markdown)
    assert "1.25× at 3 layers, 1.50× at 6 layers" in shown
    assert len(at.get("vega_lite_chart")) == 2
