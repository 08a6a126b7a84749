"""On the GPU machine: print every TensorRT network layer's name, type and metadata per ONNX model of
the folder given (scripts/trt_layer_models.py wrote them); then check that polygraphy's
--trt-network-postprocess-script runs with this parser. Needs the TensorRT-RTX wheels installed as
scripts/gpu-smoke.sh's "install" step does, POLYGRAPHY_USE_TENSORRT_RTX=1 and this checkout on
PYTHONPATH. Its output: tests/golden/trt_layer_names.txt."""

import glob
import sys

from reprokit.engine.backends.trt_setup import load_tensorrt

trt, rtx = load_tensorrt()
print("module", trt.__name__, trt.__version__, "rtx", rtx)
logger = trt.Logger(trt.Logger.WARNING)
for path in sorted(glob.glob(sys.argv[1] + "/*.onnx")):
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(path)
    print(f"== {path.split('/')[-1]} parsed={ok}")
    for i in range(parser.num_errors):
        print("  error:", parser.get_error(i))
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        outs = [
            f"{layer.get_output(j).name}:{layer.get_output(j).dtype}"
            for j in range(layer.num_outputs)
        ]
        print(
            f"  {i}\t{layer.name!r}\t{layer.type}\tmetadata={getattr(layer, 'metadata', None)!r}\tout={outs}"
        )
sys.stdout.flush()
from polygraphy.tools._main import main  # noqa: E402  (after TensorRT-RTX is aliased)

for argv in (
    [
        "polygraphy",
        "inspect",
        "model",
        sys.argv[1] + "/prefix.onnx",
        "--display-as=trt",
        "--show",
        "layers",
        "--trt-network-postprocess-script",
        sys.argv[1] + "/pin.py",
    ],
    [
        "polygraphy",
        "convert",
        sys.argv[1] + "/prefix.onnx",
        "-o",
        "/tmp/prefix.engine",
        "--trt-network-postprocess-script",
        sys.argv[1] + "/pin.py:postprocess",
    ],
):
    print("== polygraphy", " ".join(argv[1:]), flush=True)
    sys.argv = argv
    try:
        main()
    except SystemExit as exc:
        print("exit", exc.code)
    except Exception as exc:
        print("raised", type(exc).__name__, exc)
