"""Hugging Face transformers models on ringzero's tensor and pipeline parallelism. One concern per module:

  hf_plans.py     the plans as data: which submodule of a model family is which
  parallelize.py  parallelize(model, mesh, plan): a causal LM sharded in place over the tensor axis
  hf_expert.py    plan="ep": a mixture-of-experts model's experts sharded over the ep axis
  hf_layers.py    the modules parallelize() puts in: parallel attention and MLP, the loss, sequence hooks
  hf_pipeline.py  the model as pipeline stages: its sequential form, the last stage's loss, a tied embedding
"""
