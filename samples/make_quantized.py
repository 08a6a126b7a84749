#!/usr/bin/env python
"""Quantize real architectures with onnxruntime's ``quantize_static`` (QDQ format), with a
calibration set that under-covers the inputs it is later fed: the shape of the INT8 report
("check your calibration data: if it doesn't cover the range seen at inference, the
quantization scales are wrong").

    python samples/make_quantized.py [--out DIR] [--only mobilenetv2,vit,ppocr_det] [--tensorrt] [--fp8]

Writes, per model: ``<name>.fp32.onnx`` (the float model), ``<name>.qdq.onnx`` (quantized),
``<name>.inputs.npz`` (the inference feeds, σ 1.5) — calibrated on 4 samples at σ 0.5.
With ``--tensorrt`` also ``<name>.trtq.onnx``: the same calibration quantized the way TensorRT's
parser takes it (int8 symmetric activations and weights, biases left float): quantize_static's
defaults (an int32 bias DequantizeLinear; uint8 with a non-zero zero point) are refused by the
TensorRT-RTX 1.7 builder (docs/quantized.md, "TensorRT"). With ``--fp8`` also ``<name>.fp8.onnx``:
FP8 (float8e4m3fn) activations and weights, opset 19, Conv/MatMul/Gemm only — onnxruntime's FP8
calibration takes only the Distribution method, and on every op it gives the constant Pad values
a zero scale (a NaN reference) — which TensorRT-RTX 1.7 builds as it is (docs/quantized.md, "FP8").

- ``mobilenetv2``: HuggingFace MobileNetV2 from a config (random weights, no hub download),
  int8 activations, int8 per-channel weights;
- ``vit``: HuggingFace ViT from a config (a transformer: MatMul, Softmax, LayerNorm, GELU),
  uint8 activations, int8 per-tensor weights;
- ``ppocr_det``: the PP-OCRv4 text detector shipped in the ``rapidocr_onnxruntime`` wheel (a
  DBNet detector), uint8 activations, int8 per-channel weights;
- ``ppocr_cls``: the text-direction classifier of the same wheel (1x3x48x192), every op
  quantize_static knows, int8: OpenVINO 2026.4 fails to compile it (a build error to shrink).

Needs ``torch`` and ``transformers`` (the first two) and ``rapidocr_onnxruntime`` (the third);
a model whose package is missing is skipped with a message. Must not be imported by reprokit.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALIBRATION_SIGMA = 0.5
FEED_SIGMA = 1.5
CALIBRATION_SAMPLES = 4
SEED = 0


@dataclass(frozen=True)
class Recipe:
    name: str
    make_fp32: Callable[[str], None]  # writes the float model to the given path
    activation: str  # "int8" | "uint8"
    per_channel: bool
    # None = quantize_static's default (every op it knows); the ViT and the detector quantize their
    # Conv/MatMul/Gemm only: OpenVINO 2026.4's low-precision transformations fail to compile a
    # dequantized bias Add / weight Mul ("index '0' out of range"), see docs/quantized.md
    op_types: tuple[str, ...] | None = None
    image: bool = False  # feeds are a synthetic text image (dark strokes on white), not noise


def _export(module, example, path: str, input_name: str) -> None:
    import torch

    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, (example,), path, input_names=[input_name], output_names=["logits"],
                          opset_version=17, dynamo=False)


class _Logits:
    """Wraps a HuggingFace model so the export has one tensor output."""

    @staticmethod
    def wrap(model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, pixel_values):
                return self.model(pixel_values=pixel_values).logits

        return Wrapped()


def make_mobilenetv2(path: str) -> None:
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(SEED)
    config = MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    model = MobileNetV2ForImageClassification(config)
    # the config's init (std 0.02) makes the logits vanish (1e-25) through 17 blocks; He init
    # keeps them O(1), as trained weights would
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(module.weight)
    _export(_Logits.wrap(model), torch.zeros(1, 3, 64, 64), path, "pixel_values")


def make_vit(path: str) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(SEED)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=128, num_labels=10)
    _export(_Logits.wrap(ViTForImageClassification(config)), torch.zeros(1, 3, 32, 32), path, "pixel_values")


def make_ppocr_det(path: str) -> None:
    import onnx
    import rapidocr_onnxruntime

    source = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
    model = onnx.load(str(source))
    # static 1x3x64x64: calibration and feeds share one shape, the quantizer needs none dynamic
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 64, 64)):
        dim.Clear()
        dim.dim_value = size
    onnx.save(model, path)


def make_ppocr_cls(path: str) -> None:
    import onnx
    import rapidocr_onnxruntime

    source = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    model = onnx.load(str(source))
    # static 1x3x48x192, the classifier's own input size (a text line)
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 48, 192)):
        dim.Clear()
        dim.dim_value = size
    onnx.save(model, path)


RECIPES = {
    "mobilenetv2": Recipe("mobilenetv2", make_mobilenetv2, "int8", per_channel=True),
    "vit": Recipe("vit", make_vit, "uint8", per_channel=False, op_types=("Conv", "MatMul", "Gemm")),
    "ppocr_det": Recipe("ppocr_det", make_ppocr_det, "uint8", per_channel=True, op_types=("Conv",), image=True),
    # every op quantize_static knows (its default), int8: OpenVINO 2026.4 refuses to compile it
    # ("index '0' out of range" on an Add of two DequantizeLinear outputs), a build error to shrink
    "ppocr_cls": Recipe("ppocr_cls", make_ppocr_cls, "int8", per_channel=False, image=True),
}


def _static_inputs(model_path: str) -> dict[str, tuple[int, ...]]:
    import onnx

    model = onnx.load(model_path)
    inits = {t.name for t in model.graph.initializer}
    return {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input if i.name not in inits}


def draw(shapes: dict[str, tuple[int, ...]], sigma: float, seed: int, *, image: bool = False) -> dict[str, np.ndarray]:
    """Feeds at scale ``sigma``: standard normal noise, or (``image``) a text-like picture —
    white (1) with dark strokes (-1), PP-OCR's normalization — plus a little noise."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in shapes.items():
        if not image:
            feeds[name] = (rng.standard_normal(shape) * sigma).astype(np.float32)
            continue
        picture = np.ones(shape, np.float32)
        for _ in range(6):
            row, col = rng.integers(4, shape[-2] - 8), rng.integers(2, shape[-1] // 2)
            picture[..., row:row + 5, col:col + rng.integers(10, shape[-1] // 2)] = -1.0
        feeds[name] = (picture * sigma + rng.standard_normal(shape) * 0.05).astype(np.float32)
    return feeds


def quantize(fp32_path: str, qdq_path: str, recipe: Recipe, *, nodes_to_exclude: list[str] | None = None,
             calibration_sigma: float = CALIBRATION_SIGMA, tensorrt: bool = False, fp8: bool = False) -> None:
    """``quantize_static`` in QDQ format on CALIBRATION_SAMPLES feeds at ``calibration_sigma``;
    ``tensorrt``: int8 symmetric activations and weights, biases not quantized (what TensorRT's
    ONNX parser accepts: no int32 DequantizeLinear input, zero points all 0); ``fp8``: float8e4m3fn
    activations and weights (Distribution calibration, per tensor, Conv/MatMul/Gemm)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    shapes = _static_inputs(fp32_path)
    samples = [draw(shapes, calibration_sigma, SEED + 100 + i, image=recipe.image) for i in range(CALIBRATION_SAMPLES)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

    if fp8:
        quantize_static(fp32_path, qdq_path, Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                        calibrate_method=CalibrationMethod.Distribution, nodes_to_exclude=nodes_to_exclude or [],
                        op_types_to_quantize=["Conv", "MatMul", "Gemm"])
        return
    activation = QuantType.QInt8 if recipe.activation == "int8" or tensorrt else QuantType.QUInt8
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False} if tensorrt else {}
    quantize_static(fp32_path, qdq_path, Reader(), quant_format=QuantFormat.QDQ, activation_type=activation,
                    weight_type=QuantType.QInt8, per_channel=recipe.per_channel,
                    nodes_to_exclude=nodes_to_exclude or [],
                    op_types_to_quantize=list(recipe.op_types) if recipe.op_types else None,
                    extra_options=extra)


def make(name: str, out: str, *, tensorrt: bool = False, fp8: bool = False) -> tuple[str, ...]:
    """(fp32 path, qdq path, inputs path[, trtq path][, fp8 path]) of sample ``name`` under ``out``."""
    recipe = RECIPES[name]
    os.makedirs(out, exist_ok=True)
    fp32 = os.path.join(out, f"{name}.fp32.onnx")
    qdq = os.path.join(out, f"{name}.qdq.onnx")
    inputs = os.path.join(out, f"{name}.inputs.npz")
    recipe.make_fp32(fp32)
    quantize(fp32, qdq, recipe)
    np.savez(inputs, **draw(_static_inputs(fp32), FEED_SIGMA, SEED, image=recipe.image))
    paths = [fp32, qdq, inputs]
    if tensorrt:
        paths.append(os.path.join(out, f"{name}.trtq.onnx"))
        quantize(fp32, paths[-1], recipe, tensorrt=True)
    if fp8:
        paths.append(os.path.join(out, f"{name}.fp8.onnx"))
        quantize(fp32, paths[-1], recipe, fp8=True)
    return tuple(paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "quantized"))
    parser.add_argument("--only", default=",".join(RECIPES))
    parser.add_argument("--tensorrt", action="store_true", help="also <name>.trtq.onnx, quantized as TensorRT's parser takes it")
    parser.add_argument("--fp8", action="store_true", help="also <name>.fp8.onnx, quantized to FP8 (float8e4m3fn, opset 19)")
    args = parser.parse_args(argv)
    for name in args.only.split(","):
        try:
            paths = make(name, args.out, tensorrt=args.tensorrt, fp8=args.fp8)
        except ImportError as exc:
            print(f"skipped {name}: {exc}", file=sys.stderr)
            continue
        print(f"{name}: " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
