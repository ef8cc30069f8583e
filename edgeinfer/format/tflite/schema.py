"""Facts of TFLite's ``schema.fbs`` (schema version 3) that the reader, the importer's op rules
and the exporter (``edgeinfer.format.tflite``) need.

Field slots are vtable offsets (``4 + 2 * field_id``) exactly as ``flatc`` generates them;
they never change for a published field, which is what makes a hand-kept table safe. Only the
tables and option tables the importer reads are listed; an option table missing here makes the
op it belongs to unsupported rather than misread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 3
FILE_IDENTIFIER = b"TFL3"

# BuiltinOperator enum: the values are 0..209 in this order.
BUILTIN_OPERATORS: tuple[str, ...] = tuple("""
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D DEPTH_TO_SPACE DEQUANTIZE
EMBEDDING_LOOKUP FLOOR FULLY_CONNECTED HASHTABLE_LOOKUP L2_NORMALIZATION L2_POOL_2D
LOCAL_RESPONSE_NORMALIZATION LOGISTIC LSH_PROJECTION LSTM MAX_POOL_2D MUL RELU RELU_N1_TO_1 RELU6
RESHAPE RESIZE_BILINEAR RNN SOFTMAX SPACE_TO_DEPTH SVDF TANH CONCAT_EMBEDDINGS SKIP_GRAM CALL CUSTOM
EMBEDDING_LOOKUP_SPARSE PAD UNIDIRECTIONAL_SEQUENCE_RNN GATHER BATCH_TO_SPACE_ND SPACE_TO_BATCH_ND
TRANSPOSE MEAN SUB DIV SQUEEZE UNIDIRECTIONAL_SEQUENCE_LSTM STRIDED_SLICE BIDIRECTIONAL_SEQUENCE_RNN
EXP TOPK_V2 SPLIT LOG_SOFTMAX DELEGATE BIDIRECTIONAL_SEQUENCE_LSTM CAST PRELU MAXIMUM ARG_MAX MINIMUM
LESS NEG PADV2 GREATER GREATER_EQUAL LESS_EQUAL SELECT SLICE SIN TRANSPOSE_CONV SPARSE_TO_DENSE TILE
EXPAND_DIMS EQUAL NOT_EQUAL LOG SUM SQRT RSQRT SHAPE POW ARG_MIN FAKE_QUANT REDUCE_PROD REDUCE_MAX
PACK LOGICAL_OR ONE_HOT LOGICAL_AND LOGICAL_NOT UNPACK REDUCE_MIN FLOOR_DIV REDUCE_ANY SQUARE
ZEROS_LIKE FILL FLOOR_MOD RANGE RESIZE_NEAREST_NEIGHBOR LEAKY_RELU SQUARED_DIFFERENCE MIRROR_PAD ABS
SPLIT_V UNIQUE CEIL REVERSE_V2 ADD_N GATHER_ND COS WHERE RANK ELU REVERSE_SEQUENCE MATRIX_DIAG
QUANTIZE MATRIX_SET_DIAG ROUND HARD_SWISH IF WHILE NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5
SCATTER_ND SELECT_V2 DENSIFY SEGMENT_SUM BATCH_MATMUL PLACEHOLDER_FOR_GREATER_OP_CODES CUMSUM
CALL_ONCE BROADCAST_TO RFFT2D CONV_3D IMAG REAL COMPLEX_ABS HASHTABLE HASHTABLE_FIND HASHTABLE_IMPORT
HASHTABLE_SIZE REDUCE_ALL CONV_3D_TRANSPOSE VAR_HANDLE READ_VARIABLE ASSIGN_VARIABLE BROADCAST_ARGS
RANDOM_STANDARD_NORMAL BUCKETIZE RANDOM_UNIFORM MULTINOMIAL GELU DYNAMIC_UPDATE_SLICE RELU_0_TO_1
UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_SUM ATAN2 UNSORTED_SEGMENT_MIN SIGN
BITCAST BITWISE_XOR RIGHT_SHIFT STABLEHLO_LOGISTIC STABLEHLO_ADD STABLEHLO_DIVIDE STABLEHLO_MULTIPLY
STABLEHLO_MAXIMUM STABLEHLO_RESHAPE STABLEHLO_CLAMP STABLEHLO_CONCATENATE STABLEHLO_BROADCAST_IN_DIM
STABLEHLO_CONVOLUTION STABLEHLO_SLICE STABLEHLO_CUSTOM_CALL STABLEHLO_REDUCE STABLEHLO_ABS
STABLEHLO_AND STABLEHLO_COSINE STABLEHLO_EXPONENTIAL STABLEHLO_FLOOR STABLEHLO_LOG STABLEHLO_MINIMUM
STABLEHLO_NEGATE STABLEHLO_OR STABLEHLO_POWER STABLEHLO_REMAINDER STABLEHLO_RSQRT STABLEHLO_SELECT
STABLEHLO_SUBTRACT STABLEHLO_TANH STABLEHLO_SCATTER STABLEHLO_COMPARE STABLEHLO_CONVERT
STABLEHLO_DYNAMIC_SLICE STABLEHLO_DYNAMIC_UPDATE_SLICE STABLEHLO_PAD STABLEHLO_IOTA
STABLEHLO_DOT_GENERAL STABLEHLO_REDUCE_WINDOW STABLEHLO_SORT STABLEHLO_WHILE STABLEHLO_GATHER
STABLEHLO_TRANSPOSE DILATE STABLEHLO_RNG_BIT_GENERATOR REDUCE_WINDOW STABLEHLO_COMPOSITE
STABLEHLO_SHIFT_LEFT STABLEHLO_CBRT STABLEHLO_CASE
""".split())
CUSTOM_OPCODE = BUILTIN_OPERATORS.index("CUSTOM")
PLACEHOLDER_FOR_GREATER_OP_CODES = BUILTIN_OPERATORS.index("PLACEHOLDER_FOR_GREATER_OP_CODES")

# TensorType enum -> numpy dtype name (None: a type the IR cannot hold as a tensor).
TENSOR_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("FLOAT32", "float32"), 1: ("FLOAT16", "float16"), 2: ("INT32", "int32"), 3: ("UINT8", "uint8"),
    4: ("INT64", "int64"), 5: ("STRING", None), 6: ("BOOL", "bool"), 7: ("INT16", "int16"),
    8: ("COMPLEX64", "complex64"), 9: ("INT8", "int8"), 10: ("FLOAT64", "float64"),
    11: ("COMPLEX128", "complex128"), 12: ("UINT64", "uint64"), 13: ("RESOURCE", None),
    14: ("VARIANT", None), 15: ("UINT32", "uint32"), 16: ("UINT16", "uint16"), 17: ("INT4", None),
    18: ("BFLOAT16", None), 19: ("INT2", None), 20: ("UINT4", None), 21: ("FLOAT8_E4M3FN", None),
    22: ("FLOAT8_E5M2", None),
}

ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")
PADDINGS = ("SAME", "VALID")


class Slot:
    """vtable offsets of the core tables."""

    MODEL_VERSION, MODEL_OPERATOR_CODES, MODEL_SUBGRAPHS, MODEL_DESCRIPTION, MODEL_BUFFERS = 4, 6, 8, 10, 12
    SUBGRAPH_TENSORS, SUBGRAPH_INPUTS, SUBGRAPH_OUTPUTS, SUBGRAPH_OPERATORS, SUBGRAPH_NAME = 4, 6, 8, 10, 12
    TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER, TENSOR_NAME, TENSOR_QUANTIZATION = 4, 6, 8, 10, 12
    TENSOR_IS_VARIABLE, TENSOR_SPARSITY, TENSOR_SHAPE_SIGNATURE = 14, 16, 18
    OPERATOR_OPCODE_INDEX, OPERATOR_INPUTS, OPERATOR_OUTPUTS = 4, 6, 8
    OPERATOR_OPTIONS_TYPE, OPERATOR_OPTIONS, OPERATOR_CUSTOM_OPTIONS = 10, 12, 14
    OPERATOR_INTERMEDIATES = 20
    QUANT_MIN, QUANT_MAX, QUANT_SCALE, QUANT_ZERO_POINT, QUANT_DETAILS_TYPE = 4, 6, 8, 10, 12
    QUANT_QUANTIZED_DIMENSION = 16
    OPCODE_DEPRECATED_BUILTIN, OPCODE_CUSTOM, OPCODE_VERSION, OPCODE_BUILTIN = 4, 6, 8, 10
    BUFFER_DATA, BUFFER_OFFSET, BUFFER_SIZE = 4, 6, 8


@dataclass(frozen=True)
class Field:
    slot: int
    kind: str  # struct format char ("b", "i", "f", "?" ...) or "int_vector"
    default: object = 0


@dataclass(frozen=True)
class OptionsTable:
    name: str
    union_type: int  # the BuiltinOptions union tag
    fields: dict[str, Field]


def _options(name: str, union_type: int, **fields: Field) -> OptionsTable:
    return OptionsTable(name, union_type, fields)



OPTIONS_TABLES: dict[str, OptionsTable] = {t.name: t for t in (
    _options("Conv2DOptions", 1, padding=Field(4, "b"), stride_w=Field(6, "i"), stride_h=Field(8, "i"),
             fused_activation_function=Field(10, "b"), dilation_w_factor=Field(12, "i", 1),
             dilation_h_factor=Field(14, "i", 1)),
    _options("DepthwiseConv2DOptions", 2, padding=Field(4, "b"), stride_w=Field(6, "i"),
             stride_h=Field(8, "i"), depth_multiplier=Field(10, "i"),
             fused_activation_function=Field(12, "b"), dilation_w_factor=Field(14, "i", 1),
             dilation_h_factor=Field(16, "i", 1)),
    _options("Pool2DOptions", 5, padding=Field(4, "b"), stride_w=Field(6, "i"), stride_h=Field(8, "i"),
             filter_width=Field(10, "i"), filter_height=Field(12, "i"),
             fused_activation_function=Field(14, "b")),
    _options("FullyConnectedOptions", 8, fused_activation_function=Field(4, "b"),
             weights_format=Field(6, "b"), keep_num_dims=Field(8, "?", False)),
    _options("SoftmaxOptions", 9, beta=Field(4, "f", 0.0)),
    _options("ConcatenationOptions", 10, axis=Field(4, "i"), fused_activation_function=Field(6, "b")),
    _options("AddOptions", 11, fused_activation_function=Field(4, "b")),
    _options("ResizeBilinearOptions", 15, align_corners=Field(8, "?", False),
             half_pixel_centers=Field(10, "?", False)),
    _options("ReshapeOptions", 17, new_shape=Field(4, "int_vector", None)),
    _options("MulOptions", 21, fused_activation_function=Field(4, "b")),
    _options("GatherOptions", 23, axis=Field(4, "i"), batch_dims=Field(6, "i")),
    _options("ReducerOptions", 27, keep_dims=Field(4, "?", False)),
    _options("SubOptions", 28, fused_activation_function=Field(4, "b")),
    _options("DivOptions", 29, fused_activation_function=Field(4, "b")),
    _options("SqueezeOptions", 30, squeeze_dims=Field(4, "int_vector", None)),
    _options("StridedSliceOptions", 32, begin_mask=Field(4, "i"), end_mask=Field(6, "i"),
             ellipsis_mask=Field(8, "i"), new_axis_mask=Field(10, "i"), shrink_axis_mask=Field(12, "i"),
             offset=Field(14, "?", False)),
    _options("SplitOptions", 35, num_splits=Field(4, "i")),
    _options("CastOptions", 37, in_data_type=Field(4, "b"), out_data_type=Field(6, "b")),
    _options("ArgMaxOptions", 40, output_type=Field(4, "b")),
    _options("LocalResponseNormalizationOptions", 13, radius=Field(4, "i"), bias=Field(6, "f", 0.0),
             alpha=Field(8, "f", 0.0), beta=Field(10, "f", 0.0)),
    _options("SpaceToDepthOptions", 19, block_size=Field(4, "i")),
    _options("DepthToSpaceOptions", 94, block_size=Field(4, "i")),
    _options("TransposeConvOptions", 49, padding=Field(4, "b"), stride_w=Field(6, "i"),
             stride_h=Field(8, "i"), fused_activation_function=Field(10, "b")),
    _options("ShapeOptions", 55, out_type=Field(4, "b")),
    _options("ArgMinOptions", 57, output_type=Field(4, "b")),
    _options("PackOptions", 59, values_count=Field(4, "i"), axis=Field(6, "i")),
    _options("UnpackOptions", 64, num=Field(4, "i"), axis=Field(6, "i")),
    _options("ResizeNearestNeighborOptions", 74, align_corners=Field(4, "?", False),
             half_pixel_centers=Field(6, "?", False)),
    _options("LeakyReluOptions", 75, alpha=Field(4, "f", 0.0)),
    _options("MirrorPadOptions", 77, mode=Field(4, "b")),
    _options("SplitVOptions", 79, num_splits=Field(4, "i")),
    _options("WhileOptions", 93, cond_subgraph_index=Field(4, "i"), body_subgraph_index=Field(6, "i")),
    _options("BatchMatMulOptions", 101, adj_x=Field(4, "?", False), adj_y=Field(6, "?", False)),
    _options("GeluOptions", 116, approximate=Field(4, "?", False)),
)}


# IR dtype name -> TensorType code (what the writer declares).
TENSOR_TYPE_CODES: dict[str, int] = {dtype: code for code, (_, dtype) in TENSOR_TYPES.items() if dtype}


def opcode_name(code: int) -> str:
    return BUILTIN_OPERATORS[code] if 0 <= code < len(BUILTIN_OPERATORS) else f"BUILTIN_{code}"


def tensor_dtype(code: int) -> str | None:
    return TENSOR_TYPES.get(code, (f"TYPE_{code}", None))[1]


def tensor_type_name(code: int) -> str:
    return TENSOR_TYPES.get(code, (f"TYPE_{code}", None))[0]


def numpy_dtype(code: int) -> np.dtype | None:
    name = tensor_dtype(code)
    return None if name is None else np.dtype(name)
