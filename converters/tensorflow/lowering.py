"""Running TensorFlow's TFLite converter (``tf.lite`` or ``tf.compat.v1.lite``) with the
settings every route of this front end shares."""

from __future__ import annotations

from edgeinfer.errors import ConversionError


def run_converter(converter, representative_data, where: str) -> bytes:
    """The ``.tflite`` flatbuffer of ``converter`` with builtin ops only; with
    ``representative_data`` a full-integer INT8 model with int8 inputs and outputs."""
    import tensorflow as tf

    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if representative_data is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([list(x) if isinstance(x, (list, tuple)) else [x]][0]
                                                    for x in representative_data)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    try:
        return bytes(converter.convert())
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if "error" in line.lower()] or str(exc).splitlines() or [""]
        raise ConversionError(f"{where}: TensorFlow's TFLite converter failed: {lines[0][:400]}") from exc

