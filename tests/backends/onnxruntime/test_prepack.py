"""prepack: onnxruntime's packed weight copies are turned off for parts with big in-memory
weights (they would double resident memory), on request, and never change results."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.backend import get_backend
from edgeinfer.backends.onnxruntime import backend as ort_backend


def _matmul_model(rng) -> ei.Model:
    w = rng.standard_normal((256, 512)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])],
                              [numpy_helper.from_array(w, "w")])
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _prepacking_disabled(executable) -> bool:
    options = executable.session.get_session_options()
    try:
        return options.get_session_config_entry("session.disable_prepacking") == "1"
    except RuntimeError:  # onnxruntime raises for a key that was never set
        return False


@pytest.mark.parametrize("option,limit,disabled", [("auto", 1 << 30, False), ("auto", 1024, True),
                                                    (True, 1024, False), (False, 1 << 30, True)])
def test_prepack_option_and_auto_limit(rng, monkeypatch, option, limit, disabled):
    monkeypatch.setattr(ort_backend, "PREPACK_AUTO_LIMIT", limit)
    model = _matmul_model(rng)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    executable = get_backend("onnxruntime", prepack=option).compile(model.graph)
    assert _prepacking_disabled(executable) is disabled
    (got,) = executable.run({"x": x}).values()
    w = model.graph.initializers["w"]
    assert_close(got, (x.astype(np.float64) @ w).astype(np.float32), rtol=1e-4, atol=1e-4)  # float32 sums


def test_bad_prepack_value_is_a_typed_error(rng):
    with pytest.raises(ei.BackendError, match="prepack"):
        ei.Session(_matmul_model(rng), backend="onnxruntime", prepack="sometimes")
