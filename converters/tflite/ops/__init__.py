"""TFLite op rules, one module per op family; importing this package registers them all."""

from edgeinfer.converters.tflite.ops import (  # noqa: F401
    control,
    conv,
    elementwise,
    nn,
    quant,
    reduce,
    shape,
)
