from passcheck import check_not_fired, check_rewrite, floats, ops

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_matmul_plus_bias_becomes_gemm(rng):
    source = HEAD + f"""
        g (float[N, 6] x) => (float[N, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}, float[5] b = {floats(rng, 5)}> {{
            a = MatMul(x, w)
            y = Add(b, a)
        }}"""
    done = check_rewrite(source, "matmul_add_to_gemm", fired={"matmul_add_to_gemm": 1}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["Gemm"] and done.after.nodes[0].inputs == ("x", "w", "b")


def test_matmul_plus_runtime_matrix_becomes_gemm(rng):
    source = HEAD + f"""
        g (float[3, 6] x, float[3, 5] r) => (float[3, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}> {{
            a = MatMul(x, w)
            y = Add(a, r)
        }}"""
    check_rewrite(source, "matmul_add_to_gemm", fired={"matmul_add_to_gemm": 1}, nodes_after=1)


def test_batched_matmul_is_not_a_gemm(rng):
    source = HEAD + f"""
        g (float[2, 3, 6] x) => (float[2, 3, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}, float[5] b = {floats(rng, 5)}> {{
            a = MatMul(x, w)
            y = Add(a, b)
        }}"""
    check_not_fired(source, "matmul_add_to_gemm", "2-D operands")


def test_addend_that_grows_the_result_is_not_a_gemm_bias(rng):
    source = HEAD + f"""
        g (float[1, 6] x) => (float[4, 5] y) <float[6, 5] w = {floats(rng, 6, 5)}, float[4, 5] b = {floats(rng, 4, 5)}> {{
            a = MatMul(x, w)
            y = Add(a, b)
        }}"""
    check_not_fired(source, "matmul_add_to_gemm", "does not broadcast")
