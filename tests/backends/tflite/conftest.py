"""Shared helpers: run a flatbuffer with the TFLite interpreter, the zoo models, and the
teacher-forced per-op comparison of a quantized model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import edgeinfer as ei
from devkit import zoo
from edgeinfer.model import Model

interpreter_module = pytest.importorskip("ai_edge_litert.interpreter")
RESOLVERS = {"xnnpack": interpreter_module.OpResolverType.AUTO,
             "builtin": interpreter_module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
ZOO = {  # builder -> keyword arguments that keep the tests fast
    "cnn_residual_depthwise": {},
    "transformer_encoder_block": {},
    "mlp_symbolic_batch": {},
    "mobilenet_v2": {"size": 64, "width_mult": 0.5},
}


def interpreter(data: bytes, resolver: str = "builtin", **kwargs):
    it = interpreter_module.Interpreter(model_content=data, experimental_op_resolver_type=RESOLVERS[resolver],
                                        **kwargs)
    it.allocate_tensors()
    return it


def run_flatbuffer(data: bytes, feeds: dict[str, np.ndarray], resolver: str = "builtin") -> list[np.ndarray]:
    """Outputs of ``data`` for ``feeds`` (given in the model's input order)."""
    it = interpreter_module.Interpreter(model_content=data, experimental_op_resolver_type=RESOLVERS[resolver])
    details = it.get_input_details()
    for detail, array in zip(details, feeds.values(), strict=True):
        if tuple(detail["shape"]) != array.shape:
            it.resize_tensor_input(detail["index"], array.shape)
    it.allocate_tensors()
    for detail, array in zip(details, feeds.values(), strict=True):
        it.set_tensor(detail["index"], array)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def opcodes(data: bytes) -> list[str]:
    """The builtin op of every operator in the file (read back with the importer's reader)."""
    from edgeinfer.converters.tflite.reader import read_model

    return [op.opcode for op in read_model(data).subgraphs[0].operators]


@pytest.fixture(scope="session")
def zoo_models():
    """name -> float ONNX model of ``devkit.zoo`` (small sizes)."""
    return {name: zoo.BUILDERS[name](**kwargs) for name, kwargs in ZOO.items()}


@pytest.fixture(scope="session")
def quantized_zoo(zoo_models):
    """(name, activations) -> static INT8 QDQ Model, calibrated on 8 seeded samples."""
    cache = {}

    def get(name: str, activations: str) -> Model:
        if (name, activations) not in cache:
            onnx_model = zoo_models[name]
            calibration = [zoo.example_inputs(onnx_model, seed=seed) for seed in range(8)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # plain INT8 (no escalation to mixed precision): every layer for the integer kernels
                cache[name, activations] = ei.quantize(ei.convert(onnx_model, optimize=2), calibration,
                                                       activations=activations, quality_floor=None)
        return cache[name, activations]

    return get


def teacher_forced_steps(model: Model, data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """For every QuantizeLinear output of a QDQ ``model``: the largest difference, in steps,
    between the interpreter's int8 tensor and edgeinfer's numpy backend computing the same
    op from the interpreter's own int8 inputs (each op's error alone, not accumulated)."""
    it = interpreter(data, "builtin", experimental_preserve_all_tensors=True)
    for detail, array in zip(it.get_input_details(), feeds.values(), strict=True):
        it.set_tensor(detail["index"], array)
    it.invoke()
    graph = model.graph
    tensors = {d["name"]: d for d in it.get_tensor_details()}

    def interpreter_value(name: str) -> np.ndarray | None:
        """The IR int8/uint8 value ``name`` as the interpreter computed it, in IR layout and dtype."""
        for tensor_name, detail in tensors.items():
            if tensor_name == name or tensor_name.startswith(name + "@"):
                array = it.get_tensor(detail["index"]).astype(np.int32)
                if "@" in tensor_name:
                    perm = [int(c) for c in tensor_name.rsplit("@", 1)[1]]
                    array = np.transpose(array, np.argsort(perm))
                if graph.values[name].dtype == "uint8":
                    array = array + 128
                return array.astype(graph.values[name].dtype)
        return None

    from edgeinfer.ir import Value

    quantized = [n.outputs[0] for n in graph.nodes if n.op_type == "QuantizeLinear"]
    forced: dict[str, tuple[Value, np.ndarray]] = {}
    nodes = []
    for node in graph.nodes:
        if node.op_type == "DequantizeLinear" and graph.values[node.inputs[0]].const is None:
            reference = interpreter_value(node.inputs[0])
            if reference is not None:
                name = f"{node.inputs[0]}__forced"
                forced[name] = (Value(name, graph.values[node.inputs[0]].dtype, reference.shape), reference)
                node = node.with_(inputs=(name, *node.inputs[1:]))
        nodes.append(node)
    inputs = list(graph.inputs) + [value for value, _ in forced.values()]
    outputs = list(graph.outputs) + [graph.values[name] for name in quantized if name not in graph.output_names]
    forced_graph = graph.replace(nodes, inputs=inputs, outputs=outputs)
    results = ei.Session(Model(forced_graph)).run({**feeds, **{k: v for k, (_, v) in forced.items()}})
    steps = {}
    for name in quantized:
        got = interpreter_value(name)
        if got is not None:
            steps[name] = int(np.abs(got.astype(np.int32) - results[name].astype(np.int32)).max())
    return steps
