import pytest
from click.testing import CliRunner
from passcheck import floats, graph_of, ops, random_feeds, run

from devkit.testing import assert_close, parse_model
from edgeinfer.cli import main
from edgeinfer.errors import PassError
from edgeinfer.passes import PIPELINE, PIPELINE_ORDER, graph_pass, load_all, manager, optimize


def conv_bn_relu(rng) -> str:
    return '<ir_version: 8, opset_import: ["" : 17]>' + f"""
        g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float[4] gamma = {floats(rng, 4)},
         float[4] beta = {floats(rng, 4)}, float[4] mean = {floats(rng, 4)}, float[4] var = {floats(rng, 4, low=0.5)},
         int64[8] p = {{0, 0, 1, 1, 0, 0, 1, 1}}> {{
            i = Identity(x)
            t = Pad(i, p)
            c = Conv(t, w)
            b = BatchNormalization(c, gamma, beta, mean, var)
            y = Relu(b)
        }}"""


def test_pipeline_is_one_ordered_list_of_registered_passes():
    load_all()
    names = [p.name for p in PIPELINE]
    assert names == [n for n in PIPELINE_ORDER if n in names]
    assert set(names) >= set(PIPELINE_ORDER) - {"cancel_transposes"}


def test_optimize_runs_to_a_fixed_point_and_reports(rng):
    graph = graph_of(conv_bn_relu(rng))
    report = []
    optimized = optimize(graph, level=2, verify=True, report=report)
    assert ops(optimized) == ["edgeinfer::FusedConv"]
    assert [r.name for r in report] == ["remove_identity", "fold_pad", "fold_batch_norm", "fuse_bias_activation",
                                        "eliminate_dead_nodes"]
    assert report[2].nodes_before == 3 and report[2].nodes_after == 2 and report[2].fired == {"bn_into_conv": 1}
    feeds = random_feeds(graph)
    assert_close(run(optimized, feeds)["y"], run(graph, feeds)["y"])
    assert optimize(optimized, level=2).nodes == optimized.nodes  # already at the fixed point


def test_level_one_keeps_standard_ops(rng):
    optimized = optimize(graph_of(conv_bn_relu(rng)), level=1)
    assert ops(optimized) == ["Conv", "Relu"]


def test_failing_pass_is_named_with_the_passes_before_it(rng, monkeypatch):
    def broken(graph):
        raise ValueError("boom")

    load_all()
    info = manager.PassInfo("broken_pass", 1, broken)
    monkeypatch.setattr(manager, "PIPELINE", [PIPELINE[0], info])
    with pytest.raises(PassError, match=r"pass 'broken_pass' failed after \['fold_constants'\]: ValueError: boom"):
        optimize(graph_of(conv_bn_relu(rng)), level=1)


def test_registering_a_pass_outside_the_pipeline_list_is_refused():
    with pytest.raises(ValueError, match="not in PIPELINE_ORDER"):
        graph_pass("stray_pass")(lambda graph: None)


def test_cli_report_prints_every_pass_that_fired(rng, tmp_path):
    import onnx

    source = tmp_path / "m.onnx"
    onnx.save(parse_model(conv_bn_relu(rng)), source)
    result = CliRunner().invoke(main, ["convert", str(source), "-o", str(tmp_path / "m.eim"), "--optimize", "2",
                                       "--report"])
    assert result.exit_code == 0, result.output
    for name in ("remove_identity", "fold_pad", "fold_batch_norm", "fuse_bias_activation"):
        assert f"pass {name}" in result.output
    assert "bn_into_conv x1" in result.output
