"""ONNX surgery: index, extraction, packs, control flow, folding, dims, load/save. Runs no engine, judges no verdict."""
