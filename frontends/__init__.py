"""Frontends that export framework models (PyTorch, TensorFlow-Keras) to ONNX for counting."""
