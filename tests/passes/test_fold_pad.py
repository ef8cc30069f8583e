from passcheck import check_not_fired, check_rewrite, floats, ops

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def padded(op: str, attrs: str = "", mode: str = "", value: str = "", pads: str = "0, 0, 1, 2, 0, 0, 2, 1",
           weights: str = "") -> str:
    extra = f", {weights}" if weights else ""
    return HEAD + f"""
        g (float[1, 2, 5, 5] x) => (float[1, 2, ?, ?] y) <int64[8] p = {{{pads}}}{extra}> {{
            v = Constant<value = float {{{value or '0.0'}}}>()
            t = Pad{mode}(x, p, v)
            y = {op}{attrs}(t{', w' if op == 'Conv' else ''})
        }}"""


def test_pad_folds_into_conv(rng):
    source = padded("Conv", "<pads = [1, 0, 0, 1]>", weights=f"float[2, 2, 3, 3] w = {floats(rng, 2, 2, 3, 3)}")
    done = check_rewrite(source, "fold_pad", fired={"pad_into_window_op": 1}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["Conv"] and done.after.nodes[0].attrs["pads"] == (2, 2, 2, 2)


def test_pad_folds_into_average_pool_counting_pads():
    done = check_rewrite(padded("AveragePool", "<kernel_shape = [2, 2]>"), "fold_pad",
                         fired={"pad_into_window_op": 1}, nodes_after=1)
    assert done.after.nodes[0].attrs["count_include_pad"] == 1


def test_minus_inf_pad_folds_into_max_pool():
    check_rewrite(padded("MaxPool", "<kernel_shape = [3, 3], strides = [2, 2]>", value="-inf"), "fold_pad",
                  fired={"pad_into_window_op": 1}, nodes_after=1)


def test_zero_pad_does_not_fold_into_max_pool():
    check_not_fired(padded("MaxPool", "<kernel_shape = [3, 3]>"), "fold_pad", "MaxPool pads with -inf")


def test_reflect_pad_does_not_fold(rng):
    source = padded("Conv", mode='<mode = "reflect">', weights=f"float[2, 2, 3, 3] w = {floats(rng, 2, 2, 3, 3)}")
    check_not_fired(source, "fold_pad", "not constant")


def test_channel_pad_does_not_fold(rng):
    source = padded("AveragePool", "<kernel_shape = [2, 2]>", pads="0, 1, 0, 0, 0, 0, 0, 0")
    check_not_fired(source, "fold_pad", "batch or channel")


def test_nonzero_pad_value_does_not_fold_into_conv(rng):
    source = padded("Conv", value="1.5", weights=f"float[2, 2, 3, 3] w = {floats(rng, 2, 2, 3, 3)}")
    check_not_fired(source, "fold_pad", "Conv pads with 0")
