"""The TFLite schema facts now live in core (``edgeinfer.format.tflite.schema``), shared by this
importer and the exporter; this module re-exports them for the importer's rules."""

from edgeinfer.format.tflite.schema import (  # noqa: F401
    ACTIVATIONS,
    BUILTIN_OPERATORS,
    CUSTOM_OPCODE,
    FILE_IDENTIFIER,
    OPTIONS_TABLES,
    PADDINGS,
    PLACEHOLDER_FOR_GREATER_OP_CODES,
    SCHEMA_VERSION,
    TENSOR_TYPE_CODES,
    TENSOR_TYPES,
    Field,
    OptionsTable,
    Slot,
    numpy_dtype,
    opcode_name,
    tensor_dtype,
    tensor_type_name,
)
