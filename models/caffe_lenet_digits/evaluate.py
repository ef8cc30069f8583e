"""Convert the Caffe LeNet with edgeinfer, run it on the held-out digits, report accuracy and
latency, and check the result against OpenCV's Caffe importer when OpenCV is installed.

    python models/caffe_lenet_digits/evaluate.py [--backend numpy|onnxruntime] [--eim out.eim]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train import CAFFEMODEL, PROTOTXT, split  # noqa: E402

import edgeinfer as ei  # noqa: E402
from edgeinfer.runtime.session import Session  # noqa: E402


def evaluate(backend: str = "numpy", eim: str | None = None, repeats: int = 200) -> dict[str, float]:
    _, images, _, labels = split()
    batch_model = ei.convert(PROTOTXT, weights=CAFFEMODEL, input_shapes={"data": images.shape})
    probabilities = Session(batch_model, backend=backend).run({"data": images})["prob"]
    results = {"images": len(labels), "accuracy": float(np.mean(probabilities.argmax(1) == labels))}

    single = ei.convert(PROTOTXT, weights=CAFFEMODEL)
    if eim:
        single.save(eim)
        single = ei.load(eim)
    session = Session(single, backend=backend)
    feeds = {"data": images[:1]}
    session.run(feeds)
    start = time.perf_counter()
    for _ in range(repeats):
        session.run(feeds)
    results["latency_ms"] = (time.perf_counter() - start) / repeats * 1e3

    try:
        import cv2
    except ImportError:
        return results
    net = cv2.dnn.readNetFromCaffe(str(PROTOTXT), str(CAFFEMODEL))
    net.setInput(images)
    reference = net.forward("prob")
    results["opencv_accuracy"] = float(np.mean(reference.argmax(1) == labels))
    results["max_abs_diff_vs_opencv"] = float(np.abs(reference - probabilities).max())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--eim", help="also save the converted model here and time the loaded file")
    args = parser.parse_args()
    results = evaluate(args.backend, args.eim)
    print(f"edgeinfer ({args.backend}) accuracy: {results['accuracy']:.4f} on {results['images']} held-out digits")
    print(f"edgeinfer ({args.backend}) latency:  {results['latency_ms']:.3f} ms per image (batch 1)")
    if "opencv_accuracy" in results:
        print(f"OpenCV DNN accuracy:         {results['opencv_accuracy']:.4f}; "
              f"max |p_edgeinfer - p_opencv| = {results['max_abs_diff_vs_opencv']:.2e}")


if __name__ == "__main__":
    main()
