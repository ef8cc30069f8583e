from passcheck import check_not_fired, check_rewrite, floats, ops

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_per_channel_mul_and_add_fold_into_conv(rng):
    source = HEAD + f"""
        g (float[N, 3, 5, 5] x) => (float[N, 4, 3, 3] y)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float[4, 1, 1] s = {floats(rng, 4, 1, 1)},
         float[1, 4, 1, 1] t = {floats(rng, 1, 4, 1, 1)}> {{
            c = Conv(x, w)
            m = Mul(s, c)
            y = Sub(m, t)
        }}"""
    done = check_rewrite(source, "fold_scale_shift", fired={"scale_shift_into_conv": 2}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["Conv"]


def test_column_scale_folds_into_matmul_and_gemm(rng):
    source = HEAD + f"""
        g (float[N, 6] x) => (float[N, 5] y, float[N, 5] z)
        <float[6, 5] w = {floats(rng, 6, 5)}, float[5, 6] wt = {floats(rng, 5, 6)}, float[5] c = {floats(rng, 5)},
         float[5] s = {floats(rng, 5, low=0.5)}, float k = {{3.0}}> {{
            a = MatMul(x, w)
            y = Div(a, s)
            b = Gemm<transB = 1, beta = 0.5>(x, wt, c)
            b2 = Mul(b, s)
            z = Add(b2, k)
        }}"""
    done = check_rewrite(source, "fold_scale_shift", fired={"scale_shift_into_dense": 3}, nodes_after=2)
    assert ops(done.after) == ["MatMul", "Gemm"]


def test_constant_chains_merge(rng):
    source = HEAD + f"""
        g (float[2, 3] x) => (float[2, 3] y) <float[3] a = {floats(rng, 3)}, float[2, 1] b = {floats(rng, 2, 1)},
         float c = {{1.5}}, float d = {{-2.0}}> {{
            m1 = Mul(x, a)
            m2 = Mul(b, m1)
            a1 = Add(m2, c)
            y = Add(a1, d)
        }}"""
    done = check_rewrite(source, "fold_scale_shift", fired={"merge_constant_chain": 2}, nodes_after=2)
    assert ops(done.after) == ["Mul", "Add"]


def test_spatial_scale_does_not_fold_into_conv(rng):
    source = HEAD + f"""
        g (float[1, 3, 5, 5] x) => (float[1, 4, 3, 3] y)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float[3, 3] s = {floats(rng, 3, 3)}> {{
            c = Conv(x, w)
            y = Mul(c, s)
        }}"""
    check_not_fired(source, "fold_scale_shift", "channel axis only")


def test_scale_of_shared_conv_output_does_not_fold(rng):
    source = HEAD + f"""
        g (float[1, 3, 5, 5] x) => (float[1, 4, 3, 3] y, float[1, 4, 3, 3] c)
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}, float[4, 1, 1] s = {floats(rng, 4, 1, 1)}> {{
            c = Conv(x, w)
            y = Mul(c, s)
        }}"""
    check_not_fired(source, "fold_scale_shift", "graph output")


def test_reversed_division_does_not_fold(rng):
    source = HEAD + f"""
        g (float[1, 6] x) => (float[1, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}, float[5] s = {floats(rng, 5)}> {{
            a = MatMul(x, w)
            y = Div(s, a)
        }}"""
    check_not_fired(source, "fold_scale_shift")
