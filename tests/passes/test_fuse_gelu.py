import pytest
from passcheck import check_not_fired, check_rewrite, ops

ERF_FORMS = {
    "div_nested": "i = Div(x, r2)\n e = Erf(i)\n a = Add(e, one)\n m = Mul(x, a)\n y = Mul(m, half)",
    "mul_half_first": "i = Mul(x, ir2)\n e = Erf(i)\n a = Add(one, e)\n h = Mul(half, x)\n y = Mul(h, a)",
    "half_on_gate": "i = Mul(ir2, x)\n e = Erf(i)\n a = Add(e, one)\n h = Mul(a, half)\n y = Mul(x, h)",
}
TANH_FORMS = {
    "pow": "c = Pow(x, three)\n k = Mul(c, cc)\n p = Add(x, k)\n s = Mul(p, sq)\n t = Tanh(s)\n"
           " a = Add(t, one)\n m = Mul(x, a)\n y = Mul(m, half)",
    "product": "xx = Mul(x, x)\n c = Mul(xx, x)\n k = Mul(cc, c)\n p = Add(k, x)\n s = Mul(sq, p)\n t = Tanh(s)\n"
               " a = Add(t, one)\n h = Mul(x, half)\n y = Mul(h, a)",
}
CONSTS = ("float r2 = {1.4142135}, float ir2 = {0.70710677}, float one = {1.0}, float half = {0.5}, "
          "float three = {3.0}, float cc = {0.044715}, float sq = {0.7978846}")


def gelu_model(body: str, opset: int = 20) -> str:
    return f'<ir_version: 9, opset_import: ["" : {opset}]>' + f"""
        g (float[N, 7] x) => (float[N, 7] y) <{CONSTS}> {{
            {body}
        }}"""


@pytest.mark.parametrize("form", sorted(ERF_FORMS))
def test_erf_gelu_fuses_to_onnx_gelu(form):
    done = check_rewrite(gelu_model(ERF_FORMS[form]), "fuse_gelu", fired={"gelu": 1}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["Gelu"] and done.after.nodes[0].attrs["approximate"] == "none"


@pytest.mark.parametrize("form", sorted(TANH_FORMS))
def test_tanh_gelu_fuses(form):
    done = check_rewrite(gelu_model(TANH_FORMS[form]), "fuse_gelu", fired={"gelu": 1}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert done.after.nodes[0].attrs["approximate"] == "tanh"


def test_old_opset_gets_the_edgeinfer_gelu():
    done = check_rewrite(gelu_model(ERF_FORMS["div_nested"], opset=17), "fuse_gelu", fired={"gelu": 1},
                         nodes_after=1, backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["edgeinfer::Gelu"]


def test_old_opset_at_level_one_does_not_fuse():
    check_not_fired(gelu_model(ERF_FORMS["div_nested"], opset=17), "fuse_gelu", "needs level 2", level=1)


def test_wrong_constant_does_not_fuse():
    check_not_fired(gelu_model(ERF_FORMS["div_nested"].replace("Mul(m, half)", "Mul(m, one)")), "fuse_gelu")


def test_shared_intermediate_does_not_fuse():
    body = ERF_FORMS["div_nested"]
    source = '<ir_version: 9, opset_import: ["" : 20]>' + f"""
        g (float[N, 7] x) => (float[N, 7] y, float[N, 7] e) <{CONSTS}> {{
            {body}
        }}"""
    check_not_fired(source, "fuse_gelu", "graph output")
