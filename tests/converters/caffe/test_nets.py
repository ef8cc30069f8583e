"""Whole networks in the styles Caffe models are deployed in, compared with OpenCV's DNN module.

Each net is written here as a prototxt, given random weights (``random_caffemodel``) and run
by edgeinfer (numpy backend) and by ``cv2.dnn.readNetFromCaffe`` on the same random input.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close


def conv(name: str, bottom: str, outputs: int, kernel: int, *, stride: int = 1, pad: int = 0, group: int = 1,
         bias: bool = True, top: str | None = None) -> str:
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top or name}"\n'
            f'  convolution_param {{ num_output: {outputs} kernel_size: {kernel} stride: {stride} pad: {pad} '
            f'group: {group} bias_term: {str(bias).lower()} }} }}\n')


def relu(name: str, blob: str) -> str:
    return f'layer {{ name: "{name}" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'


def pool(name: str, bottom: str, method: str, kernel: int, stride: int, pad: int = 0) -> str:
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}"\n'
            f'  pooling_param {{ pool: {method} kernel_size: {kernel} stride: {stride} pad: {pad} }} }}\n')


def bn_scale(name: str, blob: str) -> str:
    return (f'layer {{ name: "{name}_bn" type: "BatchNorm" bottom: "{blob}" top: "{blob}" }}\n'
            f'layer {{ name: "{name}_scale" type: "Scale" bottom: "{blob}" top: "{blob}" '
            'scale_param { bias_term: true } }\n')


LENET = """
name: "LeNet"
input: "data"
input_shape { dim: 2 dim: 1 dim: 28 dim: 28 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 stride: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 stride: 1 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""

LENET_V1 = """
name: "LeNet"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 28 input_dim: 28
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 stride: 1 } }
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "conv2" type: CONVOLUTION bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 stride: 1 } }
layers { name: "pool2" type: POOLING bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip1" type: INNER_PRODUCT bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 } }
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers { name: "ip2" type: INNER_PRODUCT bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
layers { name: "prob" type: SOFTMAX bottom: "ip2" top: "prob" }
"""

ALEXNET = """
name: "AlexNetStyle"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 99 dim: 99 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 16 kernel_size: 11 stride: 4 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 group: 2 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "norm2" type: "LRN" bottom: "conv2" top: "norm2" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "pool2" type: "Pooling" bottom: "norm2" top: "pool2" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3" convolution_param { num_output: 48 pad: 1 kernel_size: 3 } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "conv4" type: "Convolution" bottom: "conv3" top: "conv4"
  convolution_param { num_output: 48 pad: 1 kernel_size: 3 group: 2 } }
layer { name: "relu4" type: "ReLU" bottom: "conv4" top: "conv4" }
layer { name: "conv5" type: "Convolution" bottom: "conv4" top: "conv5"
  convolution_param { num_output: 32 pad: 1 kernel_size: 3 group: 2 } }
layer { name: "relu5" type: "ReLU" bottom: "conv5" top: "conv5" }
layer { name: "pool5" type: "Pooling" bottom: "conv5" top: "pool5" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc6" type: "InnerProduct" bottom: "pool5" top: "fc6" inner_product_param { num_output: 64 } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 } }
layer { name: "fc7" type: "InnerProduct" bottom: "fc6" top: "fc7" inner_product_param { num_output: 64 } }
layer { name: "relu7" type: "ReLU" bottom: "fc7" top: "fc7" }
layer { name: "fc8" type: "InnerProduct" bottom: "fc7" top: "fc8" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }
"""

ALEXNET_V1 = """
name: "AlexNetStyle"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 99 input_dim: 99
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
  convolution_param { num_output: 16 kernel_size: 11 stride: 4 } }
layers { name: "relu1" type: RELU bottom: "conv1" top: "conv1" }
layers { name: "norm1" type: LRN bottom: "conv1" top: "norm1" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layers { name: "pool1" type: POOLING bottom: "norm1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layers { name: "conv2" type: CONVOLUTION bottom: "pool1" top: "conv2"
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 group: 2 } }
layers { name: "relu2" type: RELU bottom: "conv2" top: "conv2" }
layers { name: "norm2" type: LRN bottom: "conv2" top: "norm2" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layers { name: "pool2" type: POOLING bottom: "norm2" top: "pool2" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layers { name: "conv3" type: CONVOLUTION bottom: "pool2" top: "conv3" convolution_param { num_output: 48 pad: 1 kernel_size: 3 } }
layers { name: "relu3" type: RELU bottom: "conv3" top: "conv3" }
layers { name: "conv4" type: CONVOLUTION bottom: "conv3" top: "conv4"
  convolution_param { num_output: 48 pad: 1 kernel_size: 3 group: 2 } }
layers { name: "relu4" type: RELU bottom: "conv4" top: "conv4" }
layers { name: "conv5" type: CONVOLUTION bottom: "conv4" top: "conv5"
  convolution_param { num_output: 32 pad: 1 kernel_size: 3 group: 2 } }
layers { name: "relu5" type: RELU bottom: "conv5" top: "conv5" }
layers { name: "pool5" type: POOLING bottom: "conv5" top: "pool5" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layers { name: "fc6" type: INNER_PRODUCT bottom: "pool5" top: "fc6" inner_product_param { num_output: 64 } }
layers { name: "relu6" type: RELU bottom: "fc6" top: "fc6" }
layers { name: "drop6" type: DROPOUT bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 } }
layers { name: "fc7" type: INNER_PRODUCT bottom: "fc6" top: "fc7" inner_product_param { num_output: 64 } }
layers { name: "relu7" type: RELU bottom: "fc7" top: "fc7" }
layers { name: "fc8" type: INNER_PRODUCT bottom: "fc7" top: "fc8" inner_product_param { num_output: 10 } }
layers { name: "prob" type: SOFTMAX bottom: "fc8" top: "prob" }
"""


def _inception(prefix: str, bottom: str) -> str:
    return (conv(f"{prefix}_1x1", bottom, 8, 1) + relu(f"{prefix}_relu_1x1", f"{prefix}_1x1")
            + conv(f"{prefix}_3x3_reduce", bottom, 6, 1) + relu(f"{prefix}_relu_3x3r", f"{prefix}_3x3_reduce")
            + conv(f"{prefix}_3x3", f"{prefix}_3x3_reduce", 12, 3, pad=1) + relu(f"{prefix}_relu_3x3", f"{prefix}_3x3")
            + conv(f"{prefix}_5x5_reduce", bottom, 4, 1) + relu(f"{prefix}_relu_5x5r", f"{prefix}_5x5_reduce")
            + conv(f"{prefix}_5x5", f"{prefix}_5x5_reduce", 6, 5, pad=2) + relu(f"{prefix}_relu_5x5", f"{prefix}_5x5")
            + pool(f"{prefix}_pool", bottom, "MAX", 3, 1, 1)
            + conv(f"{prefix}_pool_proj", f"{prefix}_pool", 4, 1) + relu(f"{prefix}_relu_pp", f"{prefix}_pool_proj")
            + f'layer {{ name: "{prefix}_output" type: "Concat" bottom: "{prefix}_1x1" bottom: "{prefix}_3x3" '
              f'bottom: "{prefix}_5x5" bottom: "{prefix}_pool_proj" top: "{prefix}_output" }}\n')


GOOGLENET = ('name: "GoogLeNetStyle"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 45 dim: 45 }\n'
             + conv("conv1", "data", 16, 7, stride=2, pad=3) + relu("relu1", "conv1")
             + pool("pool1", "conv1", "MAX", 3, 2)  # 23 -> ceil((23 - 3) / 2) + 1 = 11
             + _inception("inc3a", "pool1")
             + pool("pool3", "inc3a_output", "MAX", 3, 2)  # 11 -> 5
             + _inception("inc4a", "pool3")
             + pool("pool5", "inc4a_output", "AVE", 3, 2, 1)
             + 'layer { name: "loss3_classifier" type: "InnerProduct" bottom: "pool5" top: "loss3_classifier" '
               'inner_product_param { num_output: 10 } }\n'
             + 'layer { name: "prob" type: "Softmax" bottom: "loss3_classifier" top: "prob" }\n')


def _residual(prefix: str, bottom: str, channels: int, stride: int, project: bool) -> str:
    text = conv(f"{prefix}_branch2a", bottom, channels, 3, stride=stride, pad=1, bias=False)
    text += bn_scale(f"{prefix}_branch2a", f"{prefix}_branch2a") + relu(f"{prefix}_relu2a", f"{prefix}_branch2a")
    text += conv(f"{prefix}_branch2b", f"{prefix}_branch2a", channels, 3, pad=1, bias=False)
    text += bn_scale(f"{prefix}_branch2b", f"{prefix}_branch2b")
    shortcut = bottom
    if project:
        text += conv(f"{prefix}_branch1", bottom, channels, 1, stride=stride, bias=False)
        text += bn_scale(f"{prefix}_branch1", f"{prefix}_branch1")
        shortcut = f"{prefix}_branch1"
    text += (f'layer {{ name: "{prefix}" type: "Eltwise" bottom: "{shortcut}" bottom: "{prefix}_branch2b" '
             f'top: "{prefix}" eltwise_param {{ operation: SUM }} }}\n')
    return text + relu(f"{prefix}_relu", prefix)


RESNET = ('name: "ResNetStyle"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 32 dim: 32 }\n'
          + conv("conv1", "data", 16, 7, stride=2, pad=3, bias=False) + bn_scale("bn_conv1", "conv1")
          + relu("conv1_relu", "conv1") + pool("pool1", "conv1", "MAX", 3, 2)
          + _residual("res2a", "pool1", 16, 1, False) + _residual("res3a", "res2a", 32, 2, True)
          + 'layer { name: "pool5" type: "Pooling" bottom: "res3a" top: "pool5" '
            'pooling_param { pool: AVE global_pooling: true } }\n'
          + 'layer { name: "fc10" type: "InnerProduct" bottom: "pool5" top: "fc10" '
            'inner_product_param { num_output: 10 } }\n'
          + 'layer { name: "prob" type: "Softmax" bottom: "fc10" top: "prob" }\n')


def _depthwise_separable(prefix: str, bottom: str, channels: int, outputs: int, stride: int) -> str:
    return (conv(f"{prefix}_dw", bottom, channels, 3, stride=stride, pad=1, group=channels, bias=False)
            + bn_scale(f"{prefix}_dw", f"{prefix}_dw")
            + f'layer {{ name: "{prefix}_dw_relu" type: "ReLU6" bottom: "{prefix}_dw" top: "{prefix}_dw" }}\n'
            + conv(f"{prefix}_sep", f"{prefix}_dw", outputs, 1, bias=False) + bn_scale(f"{prefix}_sep", f"{prefix}_sep")
            + relu(f"{prefix}_sep_relu", f"{prefix}_sep"))


MOBILENET = ('name: "MobileNetStyle"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 33 dim: 33 }\n'
             + conv("conv0", "data", 8, 3, stride=2, pad=1, bias=False) + bn_scale("conv0", "conv0")
             + relu("conv0_relu", "conv0")
             + _depthwise_separable("conv1", "conv0", 8, 16, 1) + _depthwise_separable("conv2", "conv1_sep", 16, 32, 2)
             + 'layer { name: "pool6" type: "Pooling" bottom: "conv2_sep" top: "pool6" '
               'pooling_param { pool: AVE global_pooling: true } }\n'
             + conv("fc7", "pool6", 10, 1)
             + 'layer { name: "prob" type: "Softmax" bottom: "fc7" top: "prob" }\n')


def _fire(prefix: str, bottom: str, squeeze: int, expand: int) -> str:
    return (conv(f"{prefix}/squeeze1x1", bottom, squeeze, 1) + relu(f"{prefix}/relu_squeeze1x1", f"{prefix}/squeeze1x1")
            + conv(f"{prefix}/expand1x1", f"{prefix}/squeeze1x1", expand, 1)
            + relu(f"{prefix}/relu_expand1x1", f"{prefix}/expand1x1")
            + conv(f"{prefix}/expand3x3", f"{prefix}/squeeze1x1", expand, 3, pad=1)
            + relu(f"{prefix}/relu_expand3x3", f"{prefix}/expand3x3")
            + f'layer {{ name: "{prefix}/concat" type: "Concat" bottom: "{prefix}/expand1x1" '
              f'bottom: "{prefix}/expand3x3" top: "{prefix}/concat" }}\n')


SQUEEZENET = ('name: "SqueezeNetStyle"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 47 dim: 47 }\n'
              + conv("conv1", "data", 16, 3, stride=2) + relu("relu_conv1", "conv1")
              + pool("pool1", "conv1", "MAX", 3, 2)
              + _fire("fire2", "pool1", 4, 8) + _fire("fire3", "fire2/concat", 4, 8)
              + pool("pool3", "fire3/concat", "MAX", 3, 2)
              + _fire("fire4", "pool3", 8, 16)
              + 'layer { name: "drop9" type: "Dropout" bottom: "fire4/concat" top: "fire4/concat" '
                'dropout_param { dropout_ratio: 0.5 } }\n'
              + conv("conv10", "fire4/concat", 10, 1) + relu("relu_conv10", "conv10")
              + 'layer { name: "pool10" type: "Pooling" bottom: "conv10" top: "pool10" '
                'pooling_param { pool: AVE global_pooling: true } }\n'
              + 'layer { name: "prob" type: "Softmax" bottom: "pool10" top: "prob" }\n')


def _ssd_source(source: str, priors: int, classes: int, prior_params: str) -> str:
    return (conv(f"{source}_mbox_loc", source, priors * 4, 3, pad=1)
            + f'layer {{ name: "{source}_mbox_loc_perm" type: "Permute" bottom: "{source}_mbox_loc" '
              f'top: "{source}_mbox_loc_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
            + f'layer {{ name: "{source}_mbox_loc_flat" type: "Flatten" bottom: "{source}_mbox_loc_perm" '
              f'top: "{source}_mbox_loc_flat" flatten_param {{ axis: 1 }} }}\n'
            + conv(f"{source}_mbox_conf", source, priors * classes, 3, pad=1)
            + f'layer {{ name: "{source}_mbox_conf_perm" type: "Permute" bottom: "{source}_mbox_conf" '
              f'top: "{source}_mbox_conf_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
            + f'layer {{ name: "{source}_mbox_conf_flat" type: "Flatten" bottom: "{source}_mbox_conf_perm" '
              f'top: "{source}_mbox_conf_flat" flatten_param {{ axis: 1 }} }}\n'
            + f'layer {{ name: "{source}_mbox_priorbox" type: "PriorBox" bottom: "{source}" bottom: "data" '
              f'top: "{source}_mbox_priorbox" prior_box_param {{ {prior_params} }} }}\n')


SSD = ('name: "SSDStyle"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 64 dim: 64 }\n'
       + conv("conv4_3", "data", 16, 3, stride=4, pad=1) + relu("relu4_3", "conv4_3")
       + 'layer { name: "conv4_3_norm" type: "Normalize" bottom: "conv4_3" top: "conv4_3_norm" '
         'norm_param { across_spatial: false channel_shared: false } }\n'
       + conv("fc7", "conv4_3", 24, 3, stride=2, pad=1) + relu("relu7", "fc7")
       + _ssd_source("conv4_3_norm", 4, 3, "min_size: 10 max_size: 25 aspect_ratio: 2 flip: true clip: false "
                     "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 4 offset: 0.5")
       + _ssd_source("fc7", 6, 3, "min_size: 25 max_size: 45 aspect_ratio: 2 aspect_ratio: 3 flip: true "
                     "clip: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2")
       + 'layer { name: "mbox_loc" type: "Concat" bottom: "conv4_3_norm_mbox_loc_flat" bottom: "fc7_mbox_loc_flat" '
         'top: "mbox_loc" concat_param { axis: 1 } }\n'
       + 'layer { name: "mbox_conf" type: "Concat" bottom: "conv4_3_norm_mbox_conf_flat" '
         'bottom: "fc7_mbox_conf_flat" top: "mbox_conf" concat_param { axis: 1 } }\n'
       + 'layer { name: "mbox_priorbox" type: "Concat" bottom: "conv4_3_norm_mbox_priorbox" '
         'bottom: "fc7_mbox_priorbox" top: "mbox_priorbox" concat_param { axis: 2 } }\n'
       + 'layer { name: "mbox_conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "mbox_conf_reshape" '
         'reshape_param { shape { dim: 0 dim: -1 dim: 3 } } }\n'
       + 'layer { name: "mbox_conf_softmax" type: "Softmax" bottom: "mbox_conf_reshape" top: "mbox_conf_softmax" '
         'softmax_param { axis: 2 } }\n'
       + 'layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "mbox_conf_softmax" top: "mbox_conf_flatten" '
         'flatten_param { axis: 1 } }\n')

NETS = {
    "lenet": (LENET, False), "lenet_v1": (LENET_V1, True), "alexnet": (ALEXNET, False),
    "alexnet_v1": (ALEXNET_V1, True), "googlenet": (GOOGLENET, False), "resnet": (RESNET, False),
    "mobilenet": (MOBILENET, False), "squeezenet": (SQUEEZENET, False), "ssd": (SSD, False),
}


@pytest.mark.parametrize("name", list(NETS))
def test_net_matches_opencv(harness, name):
    text, v1 = NETS[name]
    model = harness.compare(text, name, v1=v1)
    model.graph.verify()
    assert model.metadata["source_format"] == "caffe"


@pytest.mark.parametrize("name", ["lenet_v1", "googlenet", "resnet", "ssd"])
def test_dynamic_batch_net_matches_opencv_at_another_batch(harness, name):
    text, v1 = NETS[name]
    model = harness.compare(text, name, v1=v1, dynamic_batch=True, batch=3)
    assert all(t.shape[0] == "N" for t in model.inputs)


def test_ssd_outputs_are_the_detection_inputs(harness):
    model = harness.compare(SSD, "ssd")
    shapes = {t.name: t.shape for t in model.outputs}
    # 16x16 cells x 4 priors + 8x8 cells x 6 priors = 1408 boxes
    assert shapes == {"mbox_loc": (1, 1408 * 4), "mbox_conf_flatten": (1, 1408 * 3),
                      "mbox_priorbox": (1, 2, 1408 * 4)}
    assert "PriorBox" not in {n.op_type for n in model.graph.nodes}  # folded to a constant


@pytest.mark.parametrize("v2, v1", [("lenet", "lenet_v1"), ("alexnet", "alexnet_v1")])
def test_v1_and_v2_forms_give_the_same_graph(harness, v2, v1):
    from edgeinfer.converters.caffe import read_caffemodel, write_caffemodel
    from edgeinfer.converters.caffe.prototxt import V1_TYPES

    proto2, weights2 = harness.write(NETS[v2][0], v2)
    proto1, _ = harness.write(NETS[v1][0], v1, weights=False)
    weights1 = harness.folder / f"{v1}.caffemodel"
    v1_names = {new: old for old, new in V1_TYPES.items()}
    layers = read_caffemodel(weights2).values()
    write_caffemodel(weights1, [(w.name, v1_names[w.type], w.blobs) for w in layers], v1=True, legacy_shapes=True)
    model2 = harness.convert(proto2, weights2)
    model1 = harness.convert(proto1, weights1)
    assert model1.graph.content_hash() == model2.graph.content_hash()
    assert model1.graph.metadata["caffe_layer_format"] == "V1"
    assert model2.graph.metadata["caffe_layer_format"] == "V2"
    feeds = harness.feeds(model2)
    out1, out2 = harness.run(model1, feeds), harness.run(model2, feeds)
    assert_close(out1["prob"], out2["prob"], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["resnet", "ssd"])
def test_converted_nets_round_trip_through_eim(harness, tmp_path, name):
    text, _ = NETS[name]
    prototxt, caffemodel = harness.write(text, name)
    model = harness.convert(prototxt, caffemodel)
    path = tmp_path / f"{name}.eim"
    model.save(path)
    loaded = ei.load(path)
    feeds = harness.feeds(model)
    before, after = harness.run(model, feeds), harness.run(loaded, feeds)
    assert set(before) == set(after)
    for blob in before:
        assert_close(after[blob], before[blob], rtol=0, atol=0, name=blob)


def test_onnxruntime_backend_agrees(harness):
    prototxt, caffemodel = harness.write(RESNET, "resnet")
    model = harness.convert(prototxt, caffemodel)
    feeds = harness.feeds(model)
    reference = harness.opencv(prototxt, caffemodel, feeds, ["prob"])
    got = harness.run(model, feeds, backend="onnxruntime")
    assert_close(got["prob"], reference["prob"], rtol=1e-4, atol=1e-5)
    assert np.isclose(got["prob"].sum(), 1.0, atol=1e-5)
