"""Layer by layer: parameter variants compared with OpenCV's Caffe importer, and with a
numpy (or PyTorch) transcription of Caffe's C++ where OpenCV departs from Caffe (it ignores
LRN's ``k``, InnerProduct's ``transpose`` and Log's parameters, and has no Bias, Threshold,
Tile or Upsample layers)."""

from __future__ import annotations

import numpy as np
import pytest

from devkit.testing import assert_close


def net(shape: tuple[int, ...], body: str) -> str:
    dims = " ".join(f"dim: {d}" for d in shape)
    return f'name: "t"\ninput: "data"\ninput_shape {{ {dims} }}\n{body}'


def run_ours(harness, text: str, name: str = "t", weights: bool = True):
    prototxt, caffemodel = harness.write(text, name, weights=weights)
    model = harness.convert(prototxt, caffemodel)
    feeds = harness.feeds(model)
    return model, feeds, harness.run(model, feeds), caffemodel


# -- pooling: Caffe's output size (ceil, clipped last window) and AVE padding semantics ------
POOL_CASES = [
    # (H, W, kernel, stride, pad, method, extra)
    (7, 7, 3, 2, 0, "MAX", ""), (8, 8, 3, 2, 0, "MAX", ""), (9, 7, 3, 2, 1, "AVE", ""),
    (10, 11, 3, 2, 1, "AVE", ""), (6, 6, 2, 3, 1, "AVE", ""), (6, 6, 2, 3, 1, "MAX", ""),
    (13, 9, 5, 3, 2, "AVE", ""), (5, 5, 4, 3, 0, "AVE", ""), (12, 12, 3, 3, 1, "AVE", ""),
    (9, 9, 3, 2, 1, "AVE", "ceil_mode: false"), (9, 8, 3, 2, 1, "MAX", "ceil_mode: false"),
    (11, 11, 3, 1, 1, "AVE", ""),
]


@pytest.mark.parametrize("height, width, kernel, stride, pad, method, extra", POOL_CASES)
def test_pooling_matches_opencv(harness, height, width, kernel, stride, pad, method, extra):
    text = net((2, 3, height, width),
               f'layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param {{ pool: {method} '
               f'kernel_size: {kernel} stride: {stride} pad: {pad} {extra} }} }}\n')
    harness.compare(text, f"pool_{method}_{height}_{kernel}_{stride}_{pad}")


def test_pooling_rectangular_and_global(harness):
    text = net((1, 4, 13, 10),
               'layer { name: "p1" type: "Pooling" bottom: "data" top: "p1" pooling_param { pool: AVE '
               'kernel_h: 4 kernel_w: 3 stride_h: 3 stride_w: 2 pad_h: 2 pad_w: 1 } }\n'
               'layer { name: "p2" type: "Pooling" bottom: "data" top: "p2" pooling_param { pool: MAX '
               'global_pooling: true } }\n'
               'layer { name: "p3" type: "Pooling" bottom: "data" top: "p3" pooling_param { pool: AVE '
               'global_pooling: true } }\n')
    harness.compare(text, "pool_rect")


def test_pooling_round_mode_floor_matches_caffe(harness):
    # BVLC's round_mode: FLOOR (OpenCV spells it ceil_mode: false): 9 -> floor((9 + 2 - 3) / 2) + 1 = 5
    text = net((1, 2, 9, 9), 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { '
                             'pool: MAX kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR } }\n')
    model, feeds, got, _ = run_ours(harness, text)
    x = np.pad(feeds["data"], ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    expected = np.stack([np.stack([x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3)) for j in range(5)], -1)
                         for i in range(5)], -2)
    assert_close(got["p"], expected)


# -- convolution --------------------------------------------------------------------------------
CONV_CASES = [
    "num_output: 8 kernel_size: 3",
    "num_output: 8 kernel_size: 3 stride: 2 pad: 1 bias_term: false",
    "num_output: 6 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 2 stride_h: 2 stride_w: 1 group: 2 dilation: 2",
    "num_output: 6 kernel_size: 3 group: 6 pad: 1",
    "num_output: 4 kernel_size: 1 stride: 3",
]


@pytest.mark.parametrize("params", CONV_CASES)
def test_convolution_matches_opencv(harness, params):
    text = net((1, 6, 11, 9), f'layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" '
                              f'convolution_param {{ {params} }} }}\n')
    harness.compare(text, "conv")


@pytest.mark.parametrize("params", ["num_output: 4 kernel_size: 4 stride: 2 pad: 1 group: 2",
                                    "num_output: 3 kernel_size: 3 stride: 1 bias_term: false",
                                    "num_output: 6 kernel_size: 2 stride: 2 group: 6"])
def test_deconvolution_matches_opencv(harness, params):
    text = net((1, 6, 7, 5), f'layer {{ name: "d" type: "Deconvolution" bottom: "data" top: "d" '
                             f'convolution_param {{ {params} }} }}\n')
    harness.compare(text, "deconv")


# -- inner product --------------------------------------------------------------------------------
def test_inner_product_axis_matches_opencv(harness):
    text = net((2, 3, 5, 4), 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                             'inner_product_param { num_output: 7 axis: 2 } }\n'
                             'layer { name: "ip3" type: "InnerProduct" bottom: "data" top: "ip3" '
                             'inner_product_param { num_output: 2 axis: -1 bias_term: false } }\n')
    model = harness.compare(text, "ip_axis")
    assert [t.shape for t in model.outputs] == [(2, 3, 7), (2, 3, 5, 2)]
    harness.compare(text, "ip_axis_dynamic", dynamic_batch=True, batch=3)


def test_inner_product_transpose_matches_caffe(harness):
    text = net((2, 3, 4), 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                          'inner_product_param { num_output: 5 transpose: true } }\n')
    model, feeds, got, caffemodel = run_ours(harness, text)
    from edgeinfer.converters.caffe import read_caffemodel

    weight, bias = read_caffemodel(caffemodel)["ip"].blobs
    assert weight.shape == (12, 5)  # (K, N) when transposed
    assert_close(got["ip"], feeds["data"].reshape(2, 12) @ weight + bias, rtol=1e-5, atol=1e-6)


# -- element-wise --------------------------------------------------------------------------------
def test_activations_match_opencv(harness):
    layers = [
        ('relu', 'ReLU', ''), ('leaky', 'ReLU', 'relu_param { negative_slope: 0.1 }'),
        ('prelu', 'PReLU', ''), ('prelu_shared', 'PReLU', 'prelu_param { channel_shared: true }'),
        ('relu6', 'ReLU6', ''), ('sigmoid', 'Sigmoid', ''), ('tanh', 'TanH', ''),
        ('elu', 'ELU', 'elu_param { alpha: 0.7 }'), ('abs', 'AbsVal', ''), ('bnll', 'BNLL', ''),
        ('power', 'Power', 'power_param { power: 2 scale: 0.5 shift: 3 }'),
        ('power_affine', 'Power', 'power_param { scale: -2 shift: 0.5 }'),
        ('exp', 'Exp', 'exp_param { base: 2 scale: 0.5 shift: 0.1 }'), ('exp_e', 'Exp', ''),
        ('log', 'Log', ''), ('drop', 'Dropout', ''),
    ]
    body = 'layer { name: "pos" type: "Power" bottom: "data" top: "pos" power_param { power: 2 shift: 0.5 } }\n'
    for name, kind, params in layers:
        bottom = "pos" if kind == "Log" else "data"
        body += f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{name}" {params} }}\n'
    harness.compare(net((2, 4, 5, 3), body), "act")


def test_log_with_base_scale_shift_matches_caffe(harness):
    text = net((2, 3), 'layer { name: "a" type: "AbsVal" bottom: "data" top: "a" }\n'
                       'layer { name: "log" type: "Log" bottom: "a" top: "log" '
                       'log_param { base: 10 scale: 2 shift: 1 } }\n')
    model, feeds, got, _ = run_ours(harness, text)
    assert_close(got["log"], np.log10(1 + 2 * np.abs(feeds["data"])), rtol=1e-5, atol=1e-6)


def test_threshold_clip_swish_match_caffe(harness):
    text = net((2, 5), 'layer { name: "th" type: "Threshold" bottom: "data" top: "th" '
                       'threshold_param { threshold: 0.3 } }\n'
                       'layer { name: "cl" type: "Clip" bottom: "data" top: "cl" clip_param { min: -0.5 max: 0.25 } }\n'
                       'layer { name: "sw" type: "Swish" bottom: "data" top: "sw" swish_param { beta: 1.5 } }\n')
    model, feeds, got, _ = run_ours(harness, text, weights=False)
    x = feeds["data"]
    assert_close(got["th"], (x > 0.3).astype(np.float32))
    assert_close(got["cl"], np.clip(x, -0.5, 0.25))
    assert_close(got["sw"], x / (1 + np.exp(-1.5 * x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("operation", ["SUM", "SUM coeff: 0.5 coeff: -1 coeff: 2", "PROD", "MAX"])
def test_eltwise_matches_opencv(harness, operation):
    body = ('layer { name: "a" type: "TanH" bottom: "data" top: "a" }\n'
            'layer { name: "b" type: "Sigmoid" bottom: "data" top: "b" }\n'
            f'layer {{ name: "e" type: "Eltwise" bottom: "data" bottom: "a" bottom: "b" top: "e" '
            f'eltwise_param {{ operation: {operation} }} }}\n')
    harness.compare(net((1, 3, 4, 5), body), "eltwise")


# -- normalization --------------------------------------------------------------------------------
def test_batchnorm_scale_bias_match_opencv(harness):
    body = ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param { eps: 0.001 } }\n'
            'layer { name: "sc" type: "Scale" bottom: "bn" top: "sc" scale_param { bias_term: true } }\n'
            'layer { name: "sc2" type: "Scale" bottom: "data" top: "sc2" scale_param { axis: 1 num_axes: 2 } }\n'
            'layer { name: "g" type: "Pooling" bottom: "data" top: "g" pooling_param { pool: AVE global_pooling: true } }\n'
            'layer { name: "gf" type: "Flatten" bottom: "g" top: "gf" }\n'
            'layer { name: "sc3" type: "Scale" bottom: "data" bottom: "gf" top: "sc3" scale_param { axis: 0 } }\n')
    harness.compare(net((1, 4, 5, 3), body), "bn")


def test_batchnorm_scale_bias_ignores_the_scale_factor_as_nvidia_caffe_and_opencv(harness):
    body = ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
            'batch_norm_param { scale_bias: true eps: 0.001 } }\n')
    model = harness.compare(net((1, 4, 5, 3), body), "bn_scale_bias")
    from edgeinfer.converters.caffe import read_caffemodel

    factor = read_caffemodel(harness.folder / "bn_scale_bias.caffemodel")["bn"].blobs[2]
    assert abs(float(factor[0]) - 1) > 0.01, "the random scale factor should differ from 1"
    assert model.graph.verify() is None


def test_batchnorm_zero_scale_factor_means_zero_statistics(harness, tmp_path):
    from edgeinfer.converters.caffe import write_caffemodel

    text = net((1, 3, 2, 2), 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" }\n')
    prototxt, _ = harness.write(text, "bn0", weights=False)
    mean, var = np.array([1, 2, 3], np.float32), np.array([4, 5, 6], np.float32)
    for factor in (0.0, 2.0):
        caffemodel = tmp_path / f"bn{factor}.caffemodel"
        write_caffemodel(caffemodel, [("bn", "BatchNorm", [mean, var, np.array([factor], np.float32)])])
        model = harness.convert(prototxt, caffemodel)
        x = harness.feeds(model)["data"]
        scale = 0.0 if factor == 0 else 1 / factor
        expected = (x - (mean * scale)[:, None, None]) / np.sqrt((var * scale)[:, None, None] + 1e-5)
        assert_close(harness.run(model, {"data": x})["bn"], expected, rtol=1e-5, atol=1e-6)


def _caffe_batch_norm_on_batch_statistics(x: np.ndarray, eps: float) -> np.ndarray:
    """Caffe's BatchNormLayer::Forward_cpu with use_global_stats_ false, in float64."""
    axes = (0, *range(2, x.ndim))
    mean = x.astype(np.float64).mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps)


def test_batchnorm_without_global_stats_matches_opencv(harness):
    """use_global_stats: false normalizes by the batch's own statistics, even in a deploy net;
    OpenCV (batch 1 only) agrees. OpenCV applies eps twice (an MVN layer, then the BatchNorm with
    mean 0 and variance 1: a factor 1 / sqrt(1 + eps)), so the default eps keeps that within
    tolerance; other eps values are checked against Caffe's arithmetic below."""
    body = ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
            'batch_norm_param { use_global_stats: false } }\n'
            'layer { name: "sc" type: "Scale" bottom: "bn" top: "sc" scale_param { bias_term: true } }\n'
            'layer { name: "bn2" type: "BatchNorm" bottom: "data" top: "bn2" batch_norm_param { use_global_stats: false } }\n')
    model = harness.compare(net((1, 4, 5, 3), body), "bn_batch")
    feeds = harness.feeds(model)
    assert_close(harness.run(model, feeds)["bn2"], _caffe_batch_norm_on_batch_statistics(feeds["data"], 1e-5),
                 rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, extra, phase", [
    ((3, 4, 5, 2), "use_global_stats: false eps: 0.01", "TEST"),
    ((2, 6), "use_global_stats: false", "TEST"),
    ((2, 3, 4, 4), "", "TRAIN"),  # unset: Caffe's default is the phase's (batch statistics in TRAIN)
])
def test_batchnorm_batch_statistics_span_the_batch_as_in_caffe(harness, shape, extra, phase):
    text = net(shape, f'layer {{ name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
                      f'batch_norm_param {{ {extra} }} }}\n')
    prototxt, caffemodel = harness.write(text, "bn_train")
    model = harness.convert(prototxt, caffemodel, phase=phase)
    x = harness.feeds(model)["data"] * 3 + 1
    eps = 0.01 if "eps" in extra else 1e-5
    assert_close(harness.run(model, {"data": x})["bn"], _caffe_batch_norm_on_batch_statistics(x, eps),
                 rtol=1e-5, atol=1e-5)


def test_batchnorm_scale_bias_on_batch_statistics_matches_caffe(harness):
    from edgeinfer.converters.caffe import read_caffemodel

    text = net((2, 3, 4, 4), 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
                             'batch_norm_param { use_global_stats: false scale_bias: true } }\n')
    model, feeds, got, caffemodel = run_ours(harness, text)
    gamma, beta = read_caffemodel(caffemodel)["bn"].blobs[3:]
    expected = _caffe_batch_norm_on_batch_statistics(feeds["data"], 1e-5) * gamma[:, None, None] + beta[:, None, None]
    assert_close(got["bn"], expected, rtol=1e-5, atol=1e-5)


def test_bias_layer_matches_caffe(harness):
    text = net((2, 3, 4), 'layer { name: "b" type: "Bias" bottom: "data" top: "b" bias_param { axis: 1 num_axes: 2 } }\n')
    model, feeds, got, caffemodel = run_ours(harness, text)
    from edgeinfer.converters.caffe import read_caffemodel

    (bias,) = read_caffemodel(caffemodel)["b"].blobs
    assert bias.shape == (3, 4)
    assert_close(got["b"], feeds["data"] + bias)


@pytest.mark.parametrize("params", ["local_size: 5 alpha: 0.5 beta: 0.75",
                                    "local_size: 3 alpha: 2 beta: 0.5 norm_region: WITHIN_CHANNEL"])
def test_lrn_matches_opencv(harness, params):
    harness.compare(net((1, 7, 6, 5), f'layer {{ name: "n" type: "LRN" bottom: "data" top: "n" '
                                      f'lrn_param {{ {params} }} }}\n'), "lrn")


def test_lrn_bias_k_matches_caffe(harness):
    # OpenCV's importer drops k; Caffe: y = x / (k + alpha / n * sum of x^2 over n channels) ^ beta
    text = net((1, 6, 3, 3), 'layer { name: "n" type: "LRN" bottom: "data" top: "n" '
                             'lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }\n')
    model, feeds, got, _ = run_ours(harness, text, weights=False)
    x = feeds["data"]
    squares = np.pad(x ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = squares[:, :-2] + squares[:, 1:-1] + squares[:, 2:]
    assert_close(got["n"], x / (2 + 0.5 / 3 * window) ** 0.75, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", ["across_spatial: false channel_shared: false",
                                    "across_spatial: true channel_shared: true",
                                    "across_spatial: false channel_shared: true eps: 0.01"])
def test_normalize_matches_opencv(harness, params):
    harness.compare(net((2, 5, 4, 3), f'layer {{ name: "n" type: "Normalize" bottom: "data" top: "n" '
                                      f'norm_param {{ {params} }} }}\n'), "normalize")


@pytest.mark.parametrize("params", ["", "across_channels: true", "normalize_variance: false"])
def test_mvn_matches_opencv(harness, params):
    harness.compare(net((2, 3, 4, 5), f'layer {{ name: "m" type: "MVN" bottom: "data" top: "m" '
                                      f'mvn_param {{ {params} }} }}\n'), "mvn")


# -- blob plumbing ----------------------------------------------------------------------------------
def test_shape_layers_match_opencv(harness):
    body = ('layer { name: "cc" type: "Concat" bottom: "data" bottom: "data" top: "cc" concat_param { axis: -1 } }\n'
            'layer { name: "cc2" type: "Concat" bottom: "data" bottom: "data" top: "cc2" concat_param { axis: 2 } }\n'
            'layer { name: "fl" type: "Flatten" bottom: "data" top: "fl" flatten_param { axis: 1 end_axis: 2 } }\n'
            'layer { name: "fl2" type: "Flatten" bottom: "data" top: "fl2" flatten_param { axis: 2 } }\n'
            'layer { name: "rs" type: "Reshape" bottom: "data" top: "rs" reshape_param { shape { dim: 0 dim: -1 dim: 7 } } }\n'
            'layer { name: "rs2" type: "Reshape" bottom: "data" top: "rs2" '
            'reshape_param { shape { dim: 2 dim: 2 } axis: 1 num_axes: 1 } }\n'
            'layer { name: "pm" type: "Permute" bottom: "data" top: "pm" '
            'permute_param { order: 0 order: 3 order: 1 order: 2 } }\n'
            'layer { name: "sm" type: "Softmax" bottom: "data" top: "sm" softmax_param { axis: 2 } }\n'
            'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            'layer { name: "cr" type: "Crop" bottom: "data" bottom: "p" top: "cr" crop_param { axis: 2 offset: 1 offset: 2 } }\n'
            'layer { name: "cr2" type: "Crop" bottom: "data" bottom: "p" top: "cr2" crop_param { axis: 1 offset: 0 } }\n')
    harness.compare(net((1, 4, 9, 7), body), "shapes")


def test_slice_and_split_match_opencv(harness):
    # OpenCV fetches outputs by layer name, so each top of a multi-top layer feeds a named layer
    body = ('layer { name: "sl" type: "Slice" bottom: "data" top: "s1" top: "s2" top: "s3" '
            'slice_param { axis: 1 slice_point: 1 slice_point: 4 } }\n'
            'layer { name: "eq" type: "Slice" bottom: "data" top: "e1" top: "e2" slice_param { axis: 2 } }\n'
            'layer { name: "sp" type: "Split" bottom: "data" top: "t1" top: "t2" }\n')
    for index, blob in enumerate(["s1", "s2", "s3", "e1", "e2", "t1", "t2"]):
        body += (f'layer {{ name: "{blob}_out" type: "Power" bottom: "{blob}" top: "{blob}_out" '
                 f'power_param {{ scale: {index + 1} }} }}\n')
    model = harness.compare(net((2, 6, 4, 3), body), "slice")
    shapes = {t.name: t.shape for t in model.outputs}
    assert shapes["s2_out"] == (2, 3, 4, 3) and shapes["e2_out"] == (2, 6, 2, 3)


def test_legacy_fields_partial_permute_reshape_and_tile_match_caffe(harness):
    # OpenCV ignores slice_dim/concat_dim, rejects negative Reshape axes and partial Permute
    # orders, and has no Tile layer; the expectations transcribe Caffe's rules.
    text = net((2, 3, 4), 'layer { name: "rs" type: "Reshape" bottom: "data" top: "rs" '
                          'reshape_param { shape { dim: 2 dim: 2 } axis: -2 num_axes: 1 } }\n'
                          'layer { name: "ap" type: "Reshape" bottom: "data" top: "ap" '
                          'reshape_param { shape { dim: 1 } axis: -1 num_axes: 0 } }\n'
                          'layer { name: "ti" type: "Tile" bottom: "data" top: "ti" tile_param { axis: 1 tiles: 3 } }\n'
                          'layer { name: "pm" type: "Permute" bottom: "data" top: "pm" permute_param { order: 2 } }\n'
                          'layer { name: "sl" type: "Slice" bottom: "data" top: "s1" top: "s2" '
                          'slice_param { slice_dim: 2 slice_point: 1 } }\n'
                          'layer { name: "cc" type: "Concat" bottom: "data" bottom: "data" top: "cc" '
                          'concat_param { concat_dim: 2 } }\n')
    model, feeds, got, _ = run_ours(harness, text, weights=False)
    x = feeds["data"]
    assert_close(got["rs"], x.reshape(2, 3, 2, 2))
    assert_close(got["ap"], x.reshape(2, 3, 4, 1))
    assert_close(got["ti"], np.tile(x, (1, 3, 1)))
    assert_close(got["pm"], x.transpose(2, 0, 1))
    assert_close(got["s1"], x[:, :, :1])
    assert_close(got["s2"], x[:, :, 1:])
    assert_close(got["cc"], np.concatenate([x, x], axis=2))


# -- resize and SSD -----------------------------------------------------------------------------------
@pytest.mark.parametrize("params", ["zoom_factor: 3", "height: 5 width: 11", "height: 1 width: 1"])
@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_interp_matches_opencv(harness, params, dynamic_batch):
    harness.compare(net((1, 3, 6, 5), f'layer {{ name: "i" type: "Interp" bottom: "data" top: "i" '
                                      f'interp_param {{ {params} }} }}\n'), "interp", dynamic_batch=dynamic_batch)


@pytest.mark.parametrize("params, size", [("shrink_factor: 2", (4, 3)), ("shrink_factor: 2 zoom_factor: 3", (10, 7)),
                                          ("zoom_factor: 2 pad_beg: -1 pad_end: -1", (9, 7))])
def test_interp_shrink_and_crop_match_torch(harness, params, size):
    import torch

    text = net((1, 3, 7, 6), f'layer {{ name: "i" type: "Interp" bottom: "data" top: "i" '
                             f'interp_param {{ {params} }} }}\n')
    model, feeds, got, _ = run_ours(harness, text, weights=False)
    x = feeds["data"]
    if "pad_beg" in params:
        x = x[:, :, 1:-1, 1:-1]
    expected = torch.nn.functional.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=True)
    assert_close(got["i"], expected.numpy(), rtol=1e-5, atol=1e-6)


def test_upsample_repeats_pixels(harness):
    text = net((1, 2, 3, 4), 'layer { name: "u" type: "Upsample" bottom: "data" top: "u" upsample_param { scale: 2 } }\n'
                             'layer { name: "u2" type: "Upsample" bottom: "data" top: "u2" '
                             'upsample_param { scale_h: 3 scale_w: 1 } }\n')
    model, feeds, got, _ = run_ours(harness, text, weights=False)
    x = feeds["data"]
    assert_close(got["u"], x.repeat(2, axis=2).repeat(2, axis=3))
    assert_close(got["u2"], x.repeat(3, axis=2))


@pytest.mark.parametrize("params", [
    "min_size: 20 max_size: 45 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: false "
    "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2",
    "min_size: 30 aspect_ratio: 2 flip: false clip: true variance: 0.1 step: 8",
    "min_size: 10 min_size: 30 max_size: 20 max_size: 50 clip: true variance: 0.1 step_h: 9 step_w: 11 offset: 0.25",
])
def test_prior_box_matches_opencv(harness, params):
    body = (f'input: "image"\ninput_shape {{ dim: 1 dim: 3 dim: 90 dim: 70 }}\n'
            f'layer {{ name: "pb" type: "PriorBox" bottom: "data" bottom: "image" top: "pb" '
            f'prior_box_param {{ {params} }} }}\n')
    harness.compare(net((1, 4, 9, 7), body), "priorbox")


def _caffe_ssd_prior_box(layer_hw, image_hw, min_sizes, max_sizes, ratios, flip, clip, variances, step_hw, offset):
    """A line-by-line transcription of Caffe-SSD's PriorBoxLayer::Forward_cpu."""
    ar_list = [1.0]
    for ratio in ratios:
        if all(abs(ratio - known) >= 1e-6 for known in ar_list):
            ar_list.append(ratio)
            if flip:
                ar_list.append(1.0 / ratio)
    (layer_h, layer_w), (img_h, img_w) = layer_hw, image_hw
    step_h, step_w = step_hw or (img_h / layer_h, img_w / layer_w)
    out = []
    for h in range(layer_h):
        for w in range(layer_w):
            center_x, center_y = (w + offset) * step_w, (h + offset) * step_h
            for s, min_size in enumerate(min_sizes):
                sizes = [(min_size, min_size)]
                if max_sizes:
                    side = np.sqrt(min_size * max_sizes[s])
                    sizes.append((side, side))
                sizes += [(min_size * np.sqrt(ar), min_size / np.sqrt(ar)) for ar in ar_list if abs(ar - 1) >= 1e-6]
                for box_w, box_h in sizes:
                    out += [(center_x - box_w / 2) / img_w, (center_y - box_h / 2) / img_h,
                            (center_x + box_w / 2) / img_w, (center_y + box_h / 2) / img_h]
    boxes = np.asarray(out, np.float32)
    if clip:
        boxes = np.clip(boxes, 0, 1)
    variance = np.tile(np.asarray(variances, np.float32), len(boxes) // len(variances))
    return np.stack([boxes, variance])[None]


def test_prior_box_explicit_image_size_matches_caffe(harness):
    # OpenCV normalizes by the image bottom even when img_h/img_w are given; Caffe-SSD does not
    body = ('input: "image"\ninput_shape { dim: 1 dim: 3 dim: 90 dim: 70 }\n'
            'layer { name: "pb" type: "PriorBox" bottom: "data" bottom: "image" top: "pb" prior_box_param { '
            'min_size: 10 min_size: 30 max_size: 20 max_size: 50 aspect_ratio: 2 flip: true clip: false '
            'variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 img_h: 100 img_w: 80 } }\n')
    model, feeds, got, _ = run_ours(harness, net((1, 4, 9, 7), body), weights=False)
    expected = _caffe_ssd_prior_box((9, 7), (100, 80), [10, 30], [20, 50], [2.0], True, False,
                                    [0.1, 0.1, 0.2, 0.2], None, 0.5)
    assert_close(got["pb"], expected, rtol=1e-5, atol=1e-6)
