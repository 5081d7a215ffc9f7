"""Probe sinks: the store gets every record; Lightning loggers get scalars by a tag scheme."""

import csv

import pytest
from lightning.pytorch.loggers import CSVLogger

from blockviz.store import RunStore
from blockviz.training.sinks import (
    AttentionMap,
    Histogram,
    LayerStat,
    LoggerSink,
    ProbeRecords,
    Sample,
    StoreSink,
    layer_tag,
    stat_tag,
)

N_LAYER = 2


def records(step: int = 4) -> ProbeRecords:
    """One probe step's worth of every record kind, for a 2-layer model."""
    return ProbeRecords(
        step=step,
        n_layer=N_LAYER,
        grad_norm=1.5,
        layer_stats=[
            LayerStat(step, 0, "param", "blocks.0.attn.qkv.weight", "grad_norm", 0.25),
            LayerStat(step, 1, "component", "attn", "grad_norm", 0.5),
            LayerStat(step, -1, "component", "embed", "update_ratio", 0.001),
            LayerStat(step, N_LAYER, "component", "block", "param_norm", 3.0),
            LayerStat(step, 0, "tap", "resid_post", "rms", 1.25),
            LayerStat(step, 1, "head", "1", "attn_entropy", 0.75),
        ],
        histograms=[Histogram(0, "resid_post", -2.0, 2.0, [1, 2, 3, 4])],
        attention=[AttentionMap(1, 0, ["a", "b"], [[1.0, 0.0], [0.25, 0.75]])],
        sample=Sample("\n", "line one\nline two"),
    )


# --------------------------------------------------------------------------- tags


@pytest.mark.parametrize(
    ("layer", "expected"), [(-1, "embed"), (0, "block0"), (1, "block1"), (2, "head")]
)
def test_layer_tags_name_embeddings_blocks_and_head(layer, expected):
    assert layer_tag(layer, N_LAYER) == expected


def test_stat_tags_follow_the_scheme():
    tags = [stat_tag(row, N_LAYER) for row in records().layer_stats]
    assert tags == [
        "grad_norm/block0/blocks.0.attn.qkv.weight",
        "grad_norm/block1/attn",
        "update_ratio/embed/embed",
        "param_norm/head/block",
        "act_rms/block0/resid_post",
        "attn_entropy/block1/head1",
    ]


# ---------------------------------------------------------------------- the store


def test_store_sink_writes_every_record_kind(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        run_id = store.create_run("sink", "{}", status="running")
        sink = StoreSink(store, run_id)
        sink.write(records())
        sink.flush()
        grad = store.scalars(run_id, names="train/grad_norm")
        assert list(zip(grad.step, grad.value, strict=True)) == [(4, 1.5)]
        stats = store.layer_stats(run_id)
        assert len(stats) == 6  # every kind, per-tensor rows included
        rms = stats.query("kind == 'tap' and stat == 'rms'")
        assert (rms.layer.item(), rms.component.item(), rms.value.item()) == (0, "resid_post", 1.25)
        hist = store.histograms(run_id, layer=0, tap="resid_post")
        assert hist["count"].tolist() == [1, 2, 3, 4] and hist.lo.min() == -2.0
        maps = store.attention(run_id, step=4)
        assert set(maps.layer) == {1} and maps.weight.sum() == pytest.approx(2.0)
        samples = store.samples(run_id)
        assert (samples.prompt.item(), samples.text.item()) == ("\n", "line one\nline two")


# -------------------------------------------------------------------- the loggers


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_logger_sink_writes_scalars_by_tag_to_csv(tmp_path):
    logger = CSVLogger(tmp_path, name="csv", version=0)
    sink = LoggerSink([logger])
    sink.write(records(step=4))
    sink.write(records(step=6))
    sink.flush()  # the CSV writer holds rows until saved
    rows = read_csv(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert [row["step"] for row in rows] == ["4", "6"]
    assert float(rows[0]["train/grad_norm"]) == 1.5
    assert float(rows[0]["grad_norm/block1/attn"]) == 0.5
    assert float(rows[0]["act_rms/block0/resid_post"]) == 1.25
    assert float(rows[0]["attn_entropy/block1/head1"]) == 0.75
    # per-tensor rows stay in the store unless asked for
    assert not any(name.endswith(".weight") for name in rows[0])


def test_logger_sink_sends_the_kinds_it_is_given(tmp_path):
    logger = CSVLogger(tmp_path, name="csv", version=0)
    sink = LoggerSink([logger], kinds=("param",))
    sink.write(records())
    sink.flush()
    (row,) = read_csv(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert set(row) == {"step", "train/grad_norm", "grad_norm/block0/blocks.0.attn.qkv.weight"}


def test_logger_sink_writes_histograms_and_samples_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb", version="", default_hp_metric=False)
    sink = LoggerSink([logger])
    sink.write(records(step=4))
    logger.finalize("success")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (scalar,) = events.Scalars("grad_norm/block1/attn")
    assert (scalar.step, scalar.value) == (4, 0.5)
    (hist,) = events.Histograms("act_hist/block0/resid_post")
    value = hist.histogram_value
    assert hist.step == 4 and value.num == 10 and list(value.bucket) == [1, 2, 3, 4]
    assert list(value.bucket_limit) == [-1.0, 0.0, 1.0, 2.0]
    assert value.sum == pytest.approx(1 * -1.5 + 2 * -0.5 + 3 * 0.5 + 4 * 1.5)
    (text,) = events.Tensors("sample/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert shown == "    \n    line one\n    line two"  # indented: Markdown keeps it verbatim
