import numpy as np
import pytest
from passcheck import check_not_fired, check_rewrite, floats, graph_of, ops, random_feeds, run

from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.passes import optimize


def bert_attention(rng, *, mask: bool = True, k_form: str = "single", scale_op: str = "Div",
                   extra_output: str = "") -> str:
    k_heads = ("kh = Transpose<perm = [0, 2, 3, 1]>(ks)" if k_form == "single" else
               "kt = Transpose<perm = [0, 2, 1, 3]>(ks)\n kh = Transpose<perm = [0, 1, 3, 2]>(kt)")
    scale = "{2.0}" if scale_op == "Div" else "{0.5}"
    mask_in = ", float[N, 1, 1, 5] mask" if mask else ""
    masked = "sm = Add(sc, mask)" if mask else "sm = Identity(sc)"
    return '<ir_version: 8, opset_import: ["" : 17]>' + f"""
        g (float[N, 5, 8] x{mask_in}) => (float[N, 5, 8] y{extra_output})
        <float[8, 8] wq = {floats(rng, 8, 8)}, float[8, 8] wk = {floats(rng, 8, 8)}, float[8, 8] wv = {floats(rng, 8, 8)},
         int64[4] split = {{0, 0, 2, 4}}, int64[3] merge = {{0, 0, 8}}, float c = {scale}> {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qs = Reshape(q, split)
            ks = Reshape(k, split)
            vs = Reshape(v, split)
            qh = Transpose<perm = [0, 2, 1, 3]>(qs)
            {k_heads}
            vh = Transpose<perm = [0, 2, 1, 3]>(vs)
            scores = MatMul(qh, kh)
            sc = {scale_op}(scores, c)
            {masked}
            p = Softmax<axis = -1>(sm)
            ctx = MatMul(p, vh)
            ct = Transpose<perm = [0, 2, 1, 3]>(ctx)
            y = Reshape(ct, merge)
        }}"""


@pytest.mark.parametrize(("k_form", "scale_op"), [("single", "Div"), ("double", "Mul")])
def test_bert_attention_with_mask_fuses(rng, k_form, scale_op):
    done = check_rewrite(bert_attention(rng, k_form=k_form, scale_op=scale_op), "fuse_attention",
                         fired={"attention": 1}, nodes_after=4, backends=("numpy", "onnxruntime"))
    node = done.after.nodes[-1]
    assert ops(done.after) == ["MatMul"] * 3 + ["edgeinfer::Attention"]
    assert node.attrs["num_heads"] == 2 and node.attrs["scale"] == 0.5 and len(node.inputs) == 4


def test_attention_without_mask_fuses(rng):
    source = bert_attention(rng, mask=False)
    graph = optimize(graph_of(source), level=1)  # removes the Identity standing in for the mask
    done = check_rewrite(graph, "fuse_attention", fired={"attention": 1}, nodes_after=4)
    assert len(done.after.nodes[-1].inputs) == 3


def test_attention_whose_probabilities_are_read_does_not_fuse(rng):
    source = bert_attention(rng, extra_output=", float[N, 2, 5, 5] p")
    check_not_fired(source, "fuse_attention", "graph output")


def test_transformer_block_optimizes_to_fused_ops():
    model = zoo.transformer_encoder_block(seq=8, d=32, heads=4)
    graph = graph_of(model)
    feeds = random_feeds(graph)
    reference = run(graph, feeds)["y"]
    report = []
    optimized = optimize(graph, level=2, verify=True, report=report)
    histogram = optimized.op_histogram()
    assert histogram["edgeinfer::Attention"] == 1
    assert histogram["edgeinfer::FusedMatMul"] == 6 and histogram["LayerNormalization"] == 2
    assert sum(1 for n in optimized.nodes if n.attrs.get("activation") == "Gelu") == 1
    assert len(optimized.nodes) < len(graph.nodes)
    for backend in ("numpy", "onnxruntime"):
        assert_close(run(optimized, feeds, backend)["y"], reference, name=f"y on {backend}")
    assert {entry.name for entry in report} >= {"fuse_attention", "fuse_gelu", "fuse_bias_activation"}
    assert np.isfinite(reference).all()
