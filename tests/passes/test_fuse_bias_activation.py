import pytest
from passcheck import check_not_fired, check_rewrite, floats, ops

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
BOTH = ("numpy", "onnxruntime")


def conv_then(rng, activation: str, extra_inits: str = "") -> str:
    return HEAD + f"""
        g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float[4] b = {floats(rng, 4)}{extra_inits}> {{
            c = Conv<pads = [1, 1, 1, 1]>(x, w, b)
            y = {activation}
        }}"""


@pytest.mark.parametrize(("activation", "inits", "name"), [
    ("Relu(c)", "", "Relu"),
    ("Clip(c, lo, hi)", ", float lo = {0.0}, float hi = {6.0}", "Clip"),
    ("LeakyRelu<alpha = 0.1>(c)", "", "LeakyRelu"),
    ("Sigmoid(c)", "", "Sigmoid"),
    ("Tanh(c)", "", "Tanh"),
    ("HardSigmoid<alpha = 0.25, beta = 0.4>(c)", "", "HardSigmoid"),
    ("HardSwish(c)", "", "HardSwish"),
])
def test_conv_activation_fuses(rng, activation, inits, name):
    done = check_rewrite(conv_then(rng, activation, inits), "fuse_bias_activation", fired={"activation": 1},
                         nodes_after=1, backends=BOTH)
    node = done.after.nodes[0]
    assert ops(done.after) == ["edgeinfer::FusedConv"] and node.attrs["activation"] == name


def test_conv_silu_fuses(rng):
    source = HEAD + f"""
        g (float[1, 3, 6, 6] x) => (float[1, 4, 4, 4] y) <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}> {{
            c = Conv(x, w)
            s = Sigmoid(c)
            y = Mul(s, c)
        }}"""
    done = check_rewrite(source, "fuse_bias_activation", fired={"silu": 1}, nodes_after=1, backends=BOTH)
    assert done.after.nodes[0].attrs["activation"] == "Silu"


def test_gemm_activation_fuses(rng):
    source = HEAD + f"""
        g (float[N, 6] x) => (float[N, 5] y) <float[5, 6] w = {floats(rng, 5, 6)}, float[5] b = {floats(rng, 5)}> {{
            a = Gemm<transB = 1, alpha = 0.5>(x, w, b)
            y = LeakyRelu<alpha = 0.2>(a)
        }}"""
    done = check_rewrite(source, "fuse_bias_activation", fired={"activation": 1}, nodes_after=1, backends=BOTH)
    assert ops(done.after) == ["edgeinfer::FusedGemm"]


def test_batched_matmul_bias_and_gelu_fuse(rng):
    source = '<ir_version: 9, opset_import: ["" : 20]>' + f"""
        g (float[2, 3, 6] x) => (float[2, 3, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}, float[5] b = {floats(rng, 5)}> {{
            a = MatMul(x, w)
            ab = Add(a, b)
            y = Gelu<approximate = "tanh">(ab)
        }}"""
    done = check_rewrite(source, "fuse_bias_activation", fired={"matmul_bias": 1, "activation": 1},
                         nodes_after=1, backends=BOTH)
    node = done.after.nodes[0]
    assert ops(done.after) == ["edgeinfer::FusedMatMul"] and node.attrs["activation"] == "GeluTanh"
    assert len(node.inputs) == 3


def test_activation_of_shared_conv_output_does_not_fuse(rng):
    source = HEAD + f"""
        g (float[1, 3, 6, 6] x) => (float[1, 4, 4, 4] y, float[1, 4, 4, 4] z)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}> {{
            c = Conv(x, w)
            y = Relu(c)
            z = Neg(c)
        }}"""
    check_not_fired(source, "fuse_bias_activation", "another consumer")


def test_runtime_clip_bounds_do_not_fuse(rng):
    source = HEAD + f"""
        g (float[1, 3, 6, 6] x, float hi) => (float[1, 4, 4, 4] y)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float lo = {{0.0}}> {{
            c = Conv(x, w)
            y = Clip(c, lo, hi)
        }}"""
    check_not_fired(source, "fuse_bias_activation")


def test_fusion_needs_level_two(rng):
    from passcheck import graph_of

    from edgeinfer.passes import optimize

    graph = graph_of(conv_then(rng, "Relu(c)"))
    assert ops(optimize(graph, level=1)) == ["Conv", "Relu"]
    assert ops(optimize(graph, level=2)) == ["edgeinfer::FusedConv"]
