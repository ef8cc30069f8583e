"""Export rules, one module per op family; importing this package registers them all."""

from edgeinfer.format.tflite.ops import compare, conv, elementwise, int8, linear, nn, shape  # noqa: F401
