"""ONNX surgery: the index and scope walker, extraction, packs, control flow, branch cuts, dims, model files. Runs no engine, judges no verdict."""
