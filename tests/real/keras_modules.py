"""Keras model code for the corpus's Keras weights that ship without a model file.

mtcnn 1.0.0 ships PNet, RNet and ONet as subclassed Keras models (``class PNet(tf.keras.Model)``
with a ``call()``, no functional inputs) and their trained weights as joblib pickles compressed
with LZ4 (``mtcnn/assets/weights/*.lz4``, a list of arrays for ``set_weights``). The classes
below are the package's (MIT licence, Iván de Paz Centeno), layer for layer and in the same
order, so that ``set_weights`` takes the arrays the package saved. The weights are read by
``load_lz4_joblib``: a small LZ4 frame decoder, so that the tests need neither the package nor
the ``lz4`` module, then joblib (scikit-learn's dependency) on the decompressed pickle.
"""

from __future__ import annotations

import io
import os


def _keras():
    import keras

    return keras


def _build_chain(model, input_shape, layers) -> None:
    """Build ``layers`` one after another from ``input_shape``, as the package's ``build`` does."""
    shape = input_shape
    for layer in layers:
        layer.build(shape)
        shape = layer.compute_output_shape(shape)
    return shape


def make_pnet():
    keras = _keras()
    L = keras.layers

    class PNet(keras.Model):
        """Proposal net: any image size in, box regression and face score per 12x12 window out."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv1 = L.Conv2D(10, (3, 3), padding="valid", name="conv1")
            self.prelu1 = L.PReLU(shared_axes=[1, 2], name="prelu1")
            self.maxpool1 = L.MaxPooling2D((2, 2), (2, 2), padding="same", name="maxpooling1")
            self.conv2 = L.Conv2D(16, (3, 3), padding="valid", name="conv2")
            self.prelu2 = L.PReLU(shared_axes=[1, 2], name="prelu2")
            self.conv3 = L.Conv2D(32, (3, 3), padding="valid", name="conv3")
            self.prelu3 = L.PReLU(shared_axes=[1, 2], name="prelu3")
            self.conv4_1 = L.Conv2D(4, (1, 1), padding="valid", name="conv4-1")
            self.conv4_2 = L.Conv2D(2, (1, 1), padding="valid", activation="softmax", name="conv4-2")

        def build(self, input_shape=(None, None, None, 3)):
            shape = _build_chain(self, input_shape, [self.conv1, self.prelu1, self.maxpool1, self.conv2,
                                                     self.prelu2, self.conv3, self.prelu3])
            self.conv4_1.build(shape)
            self.conv4_2.build(shape)
            super().build(input_shape)

        def call(self, inputs):
            x = self.maxpool1(self.prelu1(self.conv1(inputs)))
            x = self.prelu2(self.conv2(x))
            x = self.prelu3(self.conv3(x))
            return [self.conv4_1(x), self.conv4_2(x)]

    return PNet()


def make_rnet():
    keras = _keras()
    L = keras.layers

    class RNet(keras.Model):
        """Refinement net: a 24x24 crop in, box regression and face score out."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv1 = L.Conv2D(28, (3, 3), padding="valid", name="conv1")
            self.prelu1 = L.PReLU(shared_axes=[1, 2], name="prelu1")
            self.maxpool1 = L.MaxPooling2D((3, 3), (2, 2), padding="same", name="maxpooling1")
            self.conv2 = L.Conv2D(48, (3, 3), padding="valid", name="conv2")
            self.prelu2 = L.PReLU(shared_axes=[1, 2], name="prelu2")
            self.maxpool2 = L.MaxPooling2D((3, 3), (2, 2), padding="valid", name="maxpooling2")
            self.conv3 = L.Conv2D(64, (2, 2), padding="valid", name="conv3")
            self.prelu3 = L.PReLU(shared_axes=[1, 2], name="prelu3")
            self.permute = L.Permute((2, 1, 3), name="permute")
            self.flatten = L.Flatten(name="flatten3")
            self.fc4 = L.Dense(128, name="fc4")
            self.prelu4 = L.PReLU(name="prelu4")
            self.fc5_1 = L.Dense(4, name="fc5-1")
            self.fc5_2 = L.Dense(2, activation="softmax", name="fc5-2")

        def build(self, input_shape=(None, 24, 24, 3)):
            shape = _build_chain(self, input_shape, [self.conv1, self.prelu1, self.maxpool1, self.conv2, self.prelu2,
                                                     self.maxpool2, self.conv3, self.prelu3, self.permute,
                                                     self.flatten, self.fc4, self.prelu4])
            self.fc5_1.build(shape)
            self.fc5_2.build(shape)
            super().build(input_shape)

        def call(self, inputs):
            x = self.maxpool1(self.prelu1(self.conv1(inputs)))
            x = self.maxpool2(self.prelu2(self.conv2(x)))
            x = self.prelu3(self.conv3(x))
            x = self.prelu4(self.fc4(self.flatten(self.permute(x))))
            return [self.fc5_1(x), self.fc5_2(x)]

    return RNet()


def make_onet():
    keras = _keras()
    L = keras.layers

    class ONet(keras.Model):
        """Output net: a 48x48 crop in, box regression, five landmarks and face score out."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv1 = L.Conv2D(32, (3, 3), padding="valid", name="conv1")
            self.prelu1 = L.PReLU(shared_axes=[1, 2], name="prelu1")
            self.maxpool1 = L.MaxPooling2D((3, 3), (2, 2), padding="same", name="maxpooling1")
            self.conv2 = L.Conv2D(64, (3, 3), padding="valid", name="conv2")
            self.prelu2 = L.PReLU(shared_axes=[1, 2], name="prelu2")
            self.maxpool2 = L.MaxPooling2D((3, 3), (2, 2), padding="valid", name="maxpooling2")
            self.conv3 = L.Conv2D(64, (3, 3), padding="valid", name="conv3")
            self.prelu3 = L.PReLU(shared_axes=[1, 2], name="prelu3")
            self.maxpool3 = L.MaxPooling2D((2, 2), (2, 2), padding="same", name="maxpooling3")
            self.conv4 = L.Conv2D(128, (2, 2), padding="valid", name="conv4")
            self.prelu4 = L.PReLU(shared_axes=[1, 2], name="prelu4")
            self.permute = L.Permute((2, 1, 3), name="permute")
            self.flatten = L.Flatten(name="flatten4")
            self.fc5 = L.Dense(256, name="fc5")
            self.prelu5 = L.PReLU(name="prelu5")
            self.fc6_1 = L.Dense(4, name="fc6-1")
            self.fc6_2 = L.Dense(10, name="fc6-2")
            self.fc6_3 = L.Dense(2, activation="softmax", name="fc6-3")

        def build(self, input_shape=(None, 48, 48, 3)):
            shape = _build_chain(self, input_shape, [self.conv1, self.prelu1, self.maxpool1, self.conv2, self.prelu2,
                                                     self.maxpool2, self.conv3, self.prelu3, self.maxpool3,
                                                     self.conv4, self.prelu4, self.permute, self.flatten, self.fc5,
                                                     self.prelu5])
            for head in (self.fc6_1, self.fc6_2, self.fc6_3):
                head.build(shape)
            super().build(input_shape)

        def call(self, inputs):
            x = self.maxpool1(self.prelu1(self.conv1(inputs)))
            x = self.maxpool2(self.prelu2(self.conv2(x)))
            x = self.maxpool3(self.prelu3(self.conv3(x)))
            x = self.prelu4(self.conv4(x))
            x = self.prelu5(self.fc5(self.flatten(self.permute(x))))
            return [self.fc6_1(x), self.fc6_2(x), self.fc6_3(x)]

    return ONet()


MTCNN_NETS = {"pnet": make_pnet, "rnet": make_rnet, "onet": make_onet}


def load_mtcnn(name: str, weights: os.PathLike | str):
    """The package's ``Stage*Net`` set-up: the subclassed net, built with its default input
    shape (batch and, for PNet, height and width dynamic), then ``set_weights`` of the file."""
    model = MTCNN_NETS[name]()
    model.build()
    model.set_weights(load_lz4_joblib(weights))
    return model


# ----------------------------------------------------------------------------- LZ4 frames

LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"


def load_lz4_joblib(path: os.PathLike | str):
    """``joblib.load`` of a file that joblib wrote with ``compress="lz4"`` (an LZ4 frame around
    the pickle)."""
    import joblib

    with open(path, "rb") as handle:
        return joblib.load(io.BytesIO(lz4_frame_decompress(handle.read())))


def lz4_frame_decompress(data: bytes) -> bytes:
    """The content of one LZ4 frame (the LZ4 frame format, version 01): linked or independent
    blocks, stored or compressed; checksums are skipped, the frame's content size is checked."""
    if data[:4] != LZ4_FRAME_MAGIC:
        raise ValueError(f"not an LZ4 frame: starts with {data[:4]!r}")
    flags = data[4]
    if flags >> 6 != 1:
        raise ValueError(f"LZ4 frame version {flags >> 6}, expected 1")
    block_checksum, has_size, content_checksum, has_dict = flags & 0x10, flags & 0x08, flags & 0x04, flags & 0x01
    position = 6  # magic, FLG, BD
    size = int.from_bytes(data[position:position + 8], "little") if has_size else None
    position += (8 if has_size else 0) + (4 if has_dict else 0) + 1  # ... and the header checksum
    out = bytearray()
    while True:
        word = int.from_bytes(data[position:position + 4], "little")
        position += 4
        if word == 0:  # end mark
            break
        length = word & 0x7FFFFFFF
        block = data[position:position + length]
        position += length + (4 if block_checksum else 0)
        if word & 0x80000000:
            out += block
        else:
            _lz4_block(block, out)
    position += 4 if content_checksum else 0
    if size is not None and size != len(out):
        raise ValueError(f"LZ4 frame declares {size} bytes, decoded {len(out)}")
    return bytes(out)


def _lz4_block(block: bytes, out: bytearray) -> None:
    """Decode one LZ4 block, appending to ``out`` (which holds the frame's earlier blocks, the
    window that matches of linked blocks reach back into)."""
    i, end = 0, len(block)
    while i < end:
        token = block[i]
        i += 1
        literals = token >> 4
        if literals == 15:
            while True:
                extra = block[i]
                i += 1
                literals += extra
                if extra != 255:
                    break
        out += block[i:i + literals]
        i += literals
        if i >= end:  # the last sequence is literals only
            break
        offset = block[i] | (block[i + 1] << 8)
        i += 2
        match = token & 15
        if match == 15:
            while True:
                extra = block[i]
                i += 1
                match += extra
                if extra != 255:
                    break
        match += 4
        start = len(out) - offset
        if offset >= match:
            out += out[start:start + match]
        else:  # the match overlaps what it writes: a repeating pattern of ``offset`` bytes
            pattern = bytes(out[start:])
            out += (pattern * (match // offset + 1))[:match]


__all__ = ["MTCNN_NETS", "load_mtcnn", "load_lz4_joblib", "lz4_frame_decompress"]
