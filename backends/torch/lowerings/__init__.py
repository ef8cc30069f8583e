"""Every torch lowering, one module per op family (importing a module registers its ops)."""

from edgeinfer.backends.torch.lowerings import (  # noqa: F401
    activations,
    conv,
    elementwise,
    fused,
    generators,
    indexing,
    matmul,
    matmul_nbits,
    normalization,
    pool,
    quantize,
    reduce,
    resize,
    shape,
    tensor,
)
