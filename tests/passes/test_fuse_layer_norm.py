from passcheck import check_not_fired, check_rewrite, floats, ops


def layer_norm(rng, opset: int, *, square: str = "Pow(d, two)", axes2: str = "[-1]", affine: bool = True) -> str:
    tail = "n = Div(d, s)\n m = Mul(n, gamma)\n y = Add(beta, m)" if affine else "y = Div(d, s)"
    return f'<ir_version: 8, opset_import: ["" : {opset}]>' + f"""
        g (float[N, 5, 8] x) => (float[N, 5, 8] y)
        <float two = {{2.0}}, float eps = {{1e-5}}, float[8] gamma = {floats(rng, 8)}, float[8] beta = {floats(rng, 8)}> {{
            mean = ReduceMean<axes = [-1]>(x)
            d = Sub(x, mean)
            p = {square}
            var = ReduceMean<axes = {axes2}>(p)
            ve = Add(var, eps)
            s = Sqrt(ve)
            {tail}
        }}"""


def test_primitive_layer_norm_with_affine_fuses_to_onnx_op(rng):
    done = check_rewrite(layer_norm(rng, 17), "fuse_layer_norm", fired={"layer_norm": 1, "layer_norm_affine": 2},
                         nodes_after=1, backends=("numpy", "onnxruntime"))
    node = done.after.nodes[0]
    assert ops(done.after) == ["LayerNormalization"] and node.attrs["axis"] == -1
    assert node.attrs["epsilon"] == 1e-5 or abs(node.attrs["epsilon"] - 1e-5) < 1e-12


def test_old_opset_gets_the_edgeinfer_op_at_level_two(rng):
    done = check_rewrite(layer_norm(rng, 13, square="Mul(d, d)", affine=False), "fuse_layer_norm",
                         fired={"layer_norm": 1}, nodes_after=1, backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["edgeinfer::LayerNormalization"]


def test_old_opset_at_level_one_does_not_fuse(rng):
    check_not_fired(layer_norm(rng, 13, affine=False), "fuse_layer_norm", "needs level 2", level=1)


def test_different_reduce_axes_do_not_fuse(rng):
    check_not_fired(layer_norm(rng, 17, axes2="[-2, -1]", affine=False), "fuse_layer_norm", "same trailing axes")
