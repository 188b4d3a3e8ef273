"""Frontends that export framework models (PyTorch, TensorFlow-Keras) to ONNX for counting.

* :mod:`.torch` ``from_torch``: a ``torch.nn.Module`` exported weightlessly (torch.export, else TorchScript), cached
* :mod:`.torch_cache` the PyTorch export's cache key (``fingerprint``: the module tree, inputs, versions)
* :mod:`.torch_errors` the PyTorch export's error messages (the operator an exporter cannot convert, batch norm)
* :mod:`.keras` ``from_keras``: a ``keras.Model`` converted with tf2onnx, cached; :mod:`.keras_rewrites` the rewrites
  that make its graph count as its PyTorch twin's
* :mod:`.keras_inputs` the Keras frontend's framework imports (TensorFlow, Keras 3, tf2onnx, quietly) and the inputs
  a model is traced with
* :mod:`.hf` ``from_hf``: a Hugging Face ``transformers`` model built from its configuration alone, then exported
* :mod:`.hf_cache` the recipe that serves a repeated ``--hf`` count from the export cache without importing torch or
  transformers (its key: the configuration file, the call, the installed versions)
* :mod:`.train_export` what a torch model (``--hf``'s, ``--torch``'s) does only in training, settled before its
  export (layer drop and SpecAugment set to 0, with the report's notes; parameters made off the meta device moved
  onto it)
* :mod:`.hf_experts` experts kept as one module each (SwitchTransformers') run as one batched top-1 product
* :mod:`.exported` what the count of an export takes from its module, as a plain record, and that count
* :mod:`.repeated` a ``transformers`` model's stack of identical layers, shown identical (``--repeated-layers``)
* :mod:`.ahead` the larger of a stack's two small exports made ahead in a forked child while the smaller is counted
* :mod:`.generate` ``from_causal_lm``: ``generate()`` of a causal LM, its prefill and decode-step graphs counted
* :mod:`.source` ``ModelSource``: a path, bytes, ModelProto, ``--torch``, ``--keras`` or ``--hf`` model, and the one
  dispatch that exports and counts it under a ``CountOptions``
* :mod:`.export` the weightless exporter (torch.export, else TorchScript; large tensors made external references)
* :mod:`.common` what they share: factories named ``MODULE:FACTORY``, the export cache, fingerprints
* :mod:`.cache_entry` an export cache entry sealed with its key and input signature, and checked when read
* :mod:`.complex` complex arithmetic as pairs of real numbers, for exports that fail on complex tensors (Llama 4)

Importing this package imports no framework; ``flopcount.from_torch`` and ``flopcount.from_keras`` are the public
entry points.
"""

__all__: list[str] = []
