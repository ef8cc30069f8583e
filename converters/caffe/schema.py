"""The Caffe message schema (the subset edgeinfer reads), built in code with no generated code.

The text below is written in ``.proto`` syntax and compiled at import time into a
``FileDescriptorProto`` in a private descriptor pool, so it cannot clash with another
``caffe.proto`` loaded in the same process. Field numbers are those of BVLC Caffe's
``caffe.proto``; messages from forks (SSD's PriorBox/Permute/Normalize, PSPNet's Interp,
SegNet/YOLO's Upsample, OpenCV's ``ceil_mode``) carry their fork's numbers where the forks
agree and a number outside BVLC's range where they do not. Prototxt parsing only depends on
field names; the weight reader (``caffemodel.py``) reads only names, types and blobs from the
binary, whose numbers are the same in every fork.
"""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "edgeinfer.caffe"

CAFFE_PROTO = """
enum Phase { TRAIN = 0; TEST = 1; }

message BlobShape { repeated int64 dim = 1 [packed = true]; }

message BlobProto {
  optional BlobShape shape = 7;
  repeated float data = 5 [packed = true];
  repeated float diff = 6 [packed = true];
  repeated double double_data = 8 [packed = true];
  repeated double double_diff = 9 [packed = true];
  optional int32 num = 1 [default = 0];
  optional int32 channels = 2 [default = 0];
  optional int32 height = 3 [default = 0];
  optional int32 width = 4 [default = 0];
}

message NetParameter {
  optional string name = 1;
  repeated string input = 3;
  repeated BlobShape input_shape = 8;
  repeated int32 input_dim = 4;
  optional bool force_backward = 5 [default = false];
  optional NetState state = 6;
  optional bool debug_info = 7 [default = false];
  repeated LayerParameter layer = 100;
  repeated V1LayerParameter layers = 2;
}

message NetState {
  optional Phase phase = 1 [default = TEST];
  optional int32 level = 2 [default = 0];
  repeated string stage = 3;
}

message NetStateRule {
  optional Phase phase = 1;
  optional int32 min_level = 2;
  optional int32 max_level = 3;
  repeated string stage = 4;
  repeated string not_stage = 5;
}

message ParamSpec {
  enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
  optional string name = 1;
  optional DimCheckMode share_mode = 2;
  optional float lr_mult = 3 [default = 1.0];
  optional float decay_mult = 4 [default = 1.0];
}

message FillerParameter {
  enum VarianceNorm { FAN_IN = 0; FAN_OUT = 1; AVERAGE = 2; }
  optional string type = 1 [default = "constant"];
  optional float value = 2 [default = 0];
  optional float min = 3 [default = 0];
  optional float max = 4 [default = 1];
  optional float mean = 5 [default = 0];
  optional float std = 6 [default = 1];
  optional int32 sparse = 7 [default = -1];
  optional VarianceNorm variance_norm = 8 [default = FAN_IN];
}

message LayerParameter {
  optional string name = 1;
  optional string type = 2;
  repeated string bottom = 3;
  repeated string top = 4;
  optional Phase phase = 10;
  repeated float loss_weight = 5;
  repeated ParamSpec param = 6;
  repeated BlobProto blobs = 7;
  repeated bool propagate_down = 11;
  repeated NetStateRule include = 8;
  repeated NetStateRule exclude = 9;
  optional TransformationParameter transform_param = 100;
  optional LossParameter loss_param = 101;
  optional AccuracyParameter accuracy_param = 102;
  optional ArgMaxParameter argmax_param = 103;
  optional BatchNormParameter batch_norm_param = 139;
  optional BiasParameter bias_param = 141;
  optional ClipParameter clip_param = 148;
  optional ConcatParameter concat_param = 104;
  optional ConvolutionParameter convolution_param = 106;
  optional CropParameter crop_param = 144;
  optional DataParameter data_param = 107;
  optional DropoutParameter dropout_param = 108;
  optional EltwiseParameter eltwise_param = 110;
  optional ELUParameter elu_param = 140;
  optional ExpParameter exp_param = 111;
  optional FlattenParameter flatten_param = 135;
  optional ImageDataParameter image_data_param = 115;
  optional InnerProductParameter inner_product_param = 117;
  optional InputParameter input_param = 143;
  optional LogParameter log_param = 134;
  optional LRNParameter lrn_param = 118;
  optional MemoryDataParameter memory_data_param = 119;
  optional MVNParameter mvn_param = 120;
  optional PoolingParameter pooling_param = 121;
  optional PowerParameter power_param = 122;
  optional PReLUParameter prelu_param = 131;
  optional ReLUParameter relu_param = 123;
  optional ReshapeParameter reshape_param = 133;
  optional ScaleParameter scale_param = 142;
  optional SigmoidParameter sigmoid_param = 124;
  optional SoftmaxParameter softmax_param = 125;
  optional SliceParameter slice_param = 126;
  optional SwishParameter swish_param = 147;
  optional TanHParameter tanh_param = 127;
  optional ThresholdParameter threshold_param = 128;
  optional TileParameter tile_param = 138;
  optional PermuteParameter permute_param = 202;
  optional PriorBoxParameter prior_box_param = 203;
  optional DetectionOutputParameter detection_output_param = 204;
  optional NormalizeParameter norm_param = 206;
  optional InterpParameter interp_param = 2210;
  optional UpsampleParameter upsample_param = 2211;
}

message TransformationParameter {
  optional float scale = 1 [default = 1];
  optional bool mirror = 2 [default = false];
  optional uint32 crop_size = 3 [default = 0];
  optional string mean_file = 4;
  repeated float mean_value = 5;
  optional bool force_color = 6 [default = false];
  optional bool force_gray = 7 [default = false];
}

message LossParameter {
  enum NormalizationMode { FULL = 0; VALID = 1; BATCH_SIZE = 2; NONE = 3; }
  optional int32 ignore_label = 1;
  optional NormalizationMode normalization = 3 [default = VALID];
  optional bool normalize = 2;
}

message AccuracyParameter {
  optional uint32 top_k = 1 [default = 1];
  optional int32 axis = 2 [default = 1];
  optional int32 ignore_label = 3;
}

message ArgMaxParameter {
  optional bool out_max_val = 1 [default = false];
  optional uint32 top_k = 2 [default = 1];
  optional int32 axis = 3;
}

message BatchNormParameter {
  optional bool use_global_stats = 1;
  optional float moving_average_fraction = 2 [default = 0.999];
  optional float eps = 3 [default = 1e-5];
  optional bool scale_bias = 7 [default = false];
}

message BiasParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
}

message ClipParameter {
  optional float min = 1;
  optional float max = 2;
}

message ConcatParameter {
  optional int32 axis = 2 [default = 1];
  optional uint32 concat_dim = 1 [default = 1];
}

message ConvolutionParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  repeated uint32 pad = 3;
  repeated uint32 kernel_size = 4;
  repeated uint32 stride = 6;
  repeated uint32 dilation = 18;
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_h = 11;
  optional uint32 kernel_w = 12;
  optional uint32 stride_h = 13;
  optional uint32 stride_w = 14;
  optional uint32 group = 5 [default = 1];
  optional FillerParameter weight_filler = 7;
  optional FillerParameter bias_filler = 8;
  optional Engine engine = 15 [default = DEFAULT];
  optional int32 axis = 16 [default = 1];
  optional bool force_nd_im2col = 17 [default = false];
}

message CropParameter {
  optional int32 axis = 1 [default = 2];
  repeated uint32 offset = 2;
}

message DataParameter {
  enum DB { LEVELDB = 0; LMDB = 1; }
  optional string source = 1;
  optional uint32 batch_size = 4;
  optional uint32 rand_skip = 7 [default = 0];
  optional DB backend = 8 [default = LEVELDB];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional bool force_encoded_color = 9 [default = false];
  optional uint32 prefetch = 10 [default = 4];
}

message DropoutParameter {
  optional float dropout_ratio = 1 [default = 0.5];
  optional bool scale_train = 2 [default = true];
}

message EltwiseParameter {
  enum EltwiseOp { PROD = 0; SUM = 1; MAX = 2; }
  optional EltwiseOp operation = 1 [default = SUM];
  repeated float coeff = 2;
  optional bool stable_prod_grad = 3 [default = true];
}

message ELUParameter { optional float alpha = 1 [default = 1]; }

message ExpParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message FlattenParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 end_axis = 2 [default = -1];
}

message ImageDataParameter {
  optional string source = 1;
  optional uint32 batch_size = 4 [default = 1];
  optional uint32 rand_skip = 7 [default = 0];
  optional bool shuffle = 8 [default = false];
  optional uint32 new_height = 9 [default = 0];
  optional uint32 new_width = 10 [default = 0];
  optional bool is_color = 11 [default = true];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional string root_folder = 12 [default = ""];
}

message InnerProductParameter {
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  optional FillerParameter weight_filler = 3;
  optional FillerParameter bias_filler = 4;
  optional int32 axis = 5 [default = 1];
  optional bool transpose = 6 [default = false];
}

message InputParameter { repeated BlobShape shape = 1; }

message LogParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message LRNParameter {
  enum NormRegion { ACROSS_CHANNELS = 0; WITHIN_CHANNEL = 1; }
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional uint32 local_size = 1 [default = 5];
  optional float alpha = 2 [default = 1.];
  optional float beta = 3 [default = 0.75];
  optional NormRegion norm_region = 4 [default = ACROSS_CHANNELS];
  optional float k = 5 [default = 1.];
  optional Engine engine = 6 [default = DEFAULT];
}

message MemoryDataParameter {
  optional uint32 batch_size = 1;
  optional uint32 channels = 2;
  optional uint32 height = 3;
  optional uint32 width = 4;
}

message MVNParameter {
  optional bool normalize_variance = 1 [default = true];
  optional bool across_channels = 2 [default = false];
  optional float eps = 3 [default = 1e-9];
}

message PoolingParameter {
  enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  enum RoundMode { CEIL = 0; FLOOR = 1; }
  optional PoolMethod pool = 1 [default = MAX];
  optional uint32 pad = 4 [default = 0];
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_size = 2;
  optional uint32 kernel_h = 5;
  optional uint32 kernel_w = 6;
  optional uint32 stride = 3 [default = 1];
  optional uint32 stride_h = 7;
  optional uint32 stride_w = 8;
  optional Engine engine = 11 [default = DEFAULT];
  optional bool global_pooling = 12 [default = false];
  optional RoundMode round_mode = 13 [default = CEIL];
  optional bool ceil_mode = 1013 [default = true];
}

message PowerParameter {
  optional float power = 1 [default = 1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}

message PReLUParameter {
  optional FillerParameter filler = 1;
  optional bool channel_shared = 2 [default = false];
}

message ReLUParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional float negative_slope = 1 [default = 0];
  optional Engine engine = 2 [default = DEFAULT];
}

message ReshapeParameter {
  optional BlobShape shape = 1;
  optional int32 axis = 2 [default = 0];
  optional int32 num_axes = 3 [default = -1];
}

message ScaleParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
  optional bool bias_term = 4 [default = false];
  optional FillerParameter bias_filler = 5;
}

message SigmoidParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}

message SliceParameter {
  optional int32 axis = 3 [default = 1];
  repeated uint32 slice_point = 2;
  optional uint32 slice_dim = 1 [default = 1];
}

message SoftmaxParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
  optional int32 axis = 2 [default = 1];
}

message SwishParameter { optional float beta = 1 [default = 1]; }

message TanHParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}

message ThresholdParameter { optional float threshold = 1 [default = 0]; }

message TileParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 tiles = 2;
}

message PermuteParameter { repeated uint32 order = 1; }

message PriorBoxParameter {
  enum CodeType { CORNER = 1; CENTER_SIZE = 2; CORNER_SIZE = 3; }
  repeated float min_size = 1;
  repeated float max_size = 2;
  repeated float aspect_ratio = 3;
  optional bool flip = 4 [default = true];
  optional bool clip = 5 [default = false];
  repeated float variance = 6;
  optional uint32 img_size = 7;
  optional uint32 img_h = 8;
  optional uint32 img_w = 9;
  optional float step = 10;
  optional float step_h = 11;
  optional float step_w = 12;
  optional float offset = 13 [default = 0.5];
}

message NonMaximumSuppressionParameter {
  optional float nms_threshold = 1 [default = 0.3];
  optional int32 top_k = 2;
  optional float eta = 3 [default = 1.0];
}

message SaveOutputParameter {
  optional string output_directory = 1;
  optional string output_name_prefix = 2;
  optional string output_format = 3;
  optional string label_map_file = 4;
  optional string name_size_file = 5;
  optional uint32 num_test_image = 6;
}

message DetectionOutputParameter {
  optional uint32 num_classes = 1;
  optional bool share_location = 2 [default = true];
  optional int32 background_label_id = 3 [default = 0];
  optional NonMaximumSuppressionParameter nms_param = 4;
  optional SaveOutputParameter save_output_param = 5;
  optional PriorBoxParameter.CodeType code_type = 6 [default = CORNER];
  optional int32 keep_top_k = 7 [default = -1];
  optional bool variance_encoded_in_target = 8 [default = false];
  optional float confidence_threshold = 9;
  optional bool normalized_bbox = 10 [default = true];
  optional bool clip = 1000 [default = false];
  optional bool visualize = 1010 [default = false];
  optional float visualize_threshold = 1011;
  optional string save_file = 1012;
}

message NormalizeParameter {
  optional bool across_spatial = 1 [default = true];
  optional FillerParameter scale_filler = 2;
  optional bool channel_shared = 3 [default = true];
  optional float eps = 4 [default = 1e-10];
}

message InterpParameter {
  optional int32 height = 1 [default = 0];
  optional int32 width = 2 [default = 0];
  optional int32 zoom_factor = 3 [default = 1];
  optional int32 shrink_factor = 4 [default = 1];
  optional int32 pad_beg = 5 [default = 0];
  optional int32 pad_end = 6 [default = 0];
}

message UpsampleParameter {
  optional uint32 scale = 1 [default = 2];
  optional uint32 scale_h = 2;
  optional uint32 scale_w = 3;
  optional bool pad_out_h = 4 [default = false];
  optional bool pad_out_w = 5 [default = false];
  optional uint32 upsample_h = 6;
  optional uint32 upsample_w = 7;
}

message V1LayerParameter {
  enum LayerType {
    NONE = 0; ABSVAL = 35; ACCURACY = 1; ARGMAX = 30; BNLL = 2; CONCAT = 3;
    CONTRASTIVE_LOSS = 37; CONVOLUTION = 4; DATA = 5; DECONVOLUTION = 39; DROPOUT = 6;
    DUMMY_DATA = 32; EUCLIDEAN_LOSS = 7; ELTWISE = 25; EXP = 38; FLATTEN = 8; HDF5_DATA = 9;
    HDF5_OUTPUT = 10; HINGE_LOSS = 28; IM2COL = 11; IMAGE_DATA = 12; INFOGAIN_LOSS = 13;
    INNER_PRODUCT = 14; LRN = 15; MEMORY_DATA = 29; MULTINOMIAL_LOGISTIC_LOSS = 16; MVN = 34;
    POOLING = 17; POWER = 26; RELU = 18; SIGMOID = 19; SIGMOID_CROSS_ENTROPY_LOSS = 27;
    SILENCE = 36; SOFTMAX = 20; SOFTMAX_LOSS = 21; SPLIT = 22; SLICE = 33; TANH = 23;
    WINDOW_DATA = 24; THRESHOLD = 31;
  }
  enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
  repeated string bottom = 2;
  repeated string top = 3;
  optional string name = 4;
  repeated NetStateRule include = 32;
  repeated NetStateRule exclude = 33;
  optional LayerType type = 5;
  repeated BlobProto blobs = 6;
  repeated string param = 1001;
  repeated DimCheckMode blob_share_mode = 1002;
  repeated float blobs_lr = 7;
  repeated float weight_decay = 8;
  repeated float loss_weight = 35;
  optional AccuracyParameter accuracy_param = 27;
  optional ArgMaxParameter argmax_param = 23;
  optional ConcatParameter concat_param = 9;
  optional ConvolutionParameter convolution_param = 10;
  optional DataParameter data_param = 11;
  optional DropoutParameter dropout_param = 12;
  optional EltwiseParameter eltwise_param = 24;
  optional ExpParameter exp_param = 41;
  optional ImageDataParameter image_data_param = 15;
  optional InnerProductParameter inner_product_param = 17;
  optional LRNParameter lrn_param = 18;
  optional MemoryDataParameter memory_data_param = 22;
  optional MVNParameter mvn_param = 34;
  optional PoolingParameter pooling_param = 19;
  optional PowerParameter power_param = 21;
  optional ReLUParameter relu_param = 30;
  optional SigmoidParameter sigmoid_param = 38;
  optional SoftmaxParameter softmax_param = 39;
  optional SliceParameter slice_param = 31;
  optional TanHParameter tanh_param = 37;
  optional ThresholdParameter threshold_param = 25;
  optional TransformationParameter transform_param = 36;
  optional LossParameter loss_param = 42;
}
"""

_SCALARS = {
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}
_LABELS = {
    "optional": descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    "repeated": descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|-?\d[\w.+-]*|[{}=;\[\]]')


def _compile(source: str) -> descriptor_pb2.FileDescriptorProto:
    """Compile the proto2 subset used above (messages, nested enums, scalar/message fields
    with ``default`` and ``packed`` options) into a ``FileDescriptorProto``."""
    tokens = _TOKEN.findall(source)
    file_proto = descriptor_pb2.FileDescriptorProto(name="edgeinfer_caffe.proto", package=PACKAGE,
                                                    syntax="proto2")
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        token = tokens[pos]
        if expected is not None and token != expected:
            raise SyntaxError(f"caffe schema: expected {expected!r}, found {token!r} at token {pos}")
        pos += 1
        return token

    def parse_enum(container) -> None:
        enum = container.add(name=take())
        take("{")
        while tokens[pos] != "}":
            name = take()
            take("=")
            enum.value.add(name=name, number=int(take()))
            take(";")
        take("}")

    fields: list[tuple[descriptor_pb2.FieldDescriptorProto, str]] = []

    def parse_message(container) -> None:
        message = container.add(name=take())
        take("{")
        while tokens[pos] != "}":
            keyword = take()
            if keyword == "enum":
                parse_enum(message.enum_type)
                continue
            type_name, name = take(), take()
            take("=")
            field = message.field.add(name=name, number=int(take()), label=_LABELS[keyword])
            if tokens[pos] == "[":
                take("[")
                while True:
                    option = take()
                    take("=")
                    value = take()
                    if option == "default":
                        field.default_value = value.strip('"')
                    elif option == "packed":
                        field.options.packed = value == "true"
                    if take() == "]":
                        break
            take(";")
            fields.append((field, type_name))
        take("}")

    while pos < len(tokens):
        keyword = take()
        if keyword == "message":
            parse_message(file_proto.message_type)
        elif keyword == "enum":
            parse_enum(file_proto.enum_type)
        else:
            raise SyntaxError(f"caffe schema: unexpected {keyword!r} at top level")
    _resolve_types(file_proto, fields)
    return file_proto


def _resolve_types(file_proto: descriptor_pb2.FileDescriptorProto,
                   fields: list[tuple[descriptor_pb2.FieldDescriptorProto, str]]) -> None:
    """Type every field; an enum name resolves to the enum nested in the field's own message
    first (several messages declare an ``Engine``), then to a top-level enum; ``Message.Enum``
    names an enum nested in another message."""
    owner_of = {id(f): m for m in file_proto.message_type for f in m.field}
    top_level = {e.name for e in file_proto.enum_type}
    messages = {m.name for m in file_proto.message_type}
    nested = {f"{m.name}.{e.name}" for m in file_proto.message_type for e in m.enum_type}
    for field, type_name in fields:
        if type_name in _SCALARS:
            field.type = _SCALARS[type_name]
            continue
        owner = owner_of[id(field)]
        if type_name in {e.name for e in owner.enum_type}:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
            field.type_name = f".{PACKAGE}.{owner.name}.{type_name}"
        elif type_name in top_level or type_name in nested:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
            field.type_name = f".{PACKAGE}.{type_name}"
        elif type_name in messages:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
            field.type_name = f".{PACKAGE}.{type_name}"
        else:
            raise SyntaxError(f"caffe schema: field {owner.name}.{field.name} has unknown type {type_name!r}")


def _build() -> dict[str, type]:
    file_proto = _compile(CAFFE_PROTO)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    file_descriptor = pool.FindFileByName(file_proto.name)
    return {name: message_factory.GetMessageClass(desc)
            for name, desc in file_descriptor.message_types_by_name.items()}


MESSAGES = _build()
NetParameter = MESSAGES["NetParameter"]
LayerParameter = MESSAGES["LayerParameter"]
V1LayerParameter = MESSAGES["V1LayerParameter"]
BlobProto = MESSAGES["BlobProto"]
BlobShape = MESSAGES["BlobShape"]
