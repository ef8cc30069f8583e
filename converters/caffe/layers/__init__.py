"""Conversion rules, one function per Caffe layer type, grouped by family."""

from edgeinfer.converters.caffe.layers import (  # noqa: F401  (importing registers the rules)
    activation,
    conv,
    dense,
    normalization,
    pooling,
    resize,
    ssd,
    tensor,
)
