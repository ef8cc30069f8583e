from passcheck import check_not_fired, check_rewrite, ops

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_reshape_chain_collapses():
    source = HEAD + """
        g (float[2, 3, 4] x) => (float[4, 6] y) <int64[2] s1 = {6, 4}, int64[3] s2 = {4, 3, 2}, int64[2] s3 = {4, -1}> {
            a = Reshape(x, s1)
            b = Reshape(a, s2)
            y = Reshape(b, s3)
        }"""
    done = check_rewrite(source, "cancel_reshapes", fired={"reshape_chain": 2}, nodes_after=1)
    assert ops(done.after) == ["Reshape"] and done.after.nodes[0].inputs[0] == "x"


def test_flatten_squeeze_then_reshape_collapses_and_zero_dims_resolve():
    source = HEAD + """
        g (float[2, 1, 6] x) => (float[2, 3, 2] y) <int64[1] ax = {1}, int64[3] s = {0, 3, 2}> {
            a = Squeeze(x, ax)
            y = Reshape(a, s)
        }"""
    done = check_rewrite(source, "cancel_reshapes", fired={"reshape_chain": 1}, nodes_after=1)
    assert done.after.nodes[0].inputs[0] == "x"


def test_noop_reshape_becomes_identity():
    source = HEAD + """
        g (float[N, 4] x) => (float[N, 4] y) <int64[2] s = {-1, 4}> {
            a = Reshape(x, s)
            y = Relu(a)
        }"""
    done = check_rewrite(source, "cancel_reshapes", fired={"noop_reshape": 1}, nodes_after=2)
    assert ops(done.after) == ["Identity", "Relu"]


def test_inner_reshape_with_another_reader_stays():
    source = HEAD + """
        g (float[2, 6] x) => (float[3, 4] y, float[12] z) <int64[1] s1 = {12}, int64[2] s2 = {3, 4}> {
            z = Reshape(x, s1)
            y = Reshape(z, s2)
        }"""
    done = check_rewrite(source, "cancel_reshapes", fired={"reshape_chain": 1}, nodes_after=2)
    assert [n.inputs[0] for n in done.after.nodes] == ["x", "x"]


def test_runtime_target_shape_is_not_collapsed():
    source = HEAD + """
        g (float[2, 6] x, int64[2] s2) => (float[?, ?] y) <int64[1] s1 = {12}> {
            a = Reshape(x, s1)
            y = Reshape(a, s2)
        }"""
    check_not_fired(source, "cancel_reshapes", "computed at run time")
