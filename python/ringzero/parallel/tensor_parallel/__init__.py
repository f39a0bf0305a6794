"""Tensor and sequence parallelism (Megatron-LM's layout): every rank of a tensor group holds a slice of
each weight. One concern per module:

  tensor.py        the region operators (copy, reduce, sequence gather and reduce-scatter) and the
                   column- and row-parallel linear layers
  vocab.py         the vocabulary split: the embedding and the cross-entropy over split logits
  tensor_gpt.py    the GPT of models/gpt.py sharded over a tensor group, optionally sequence parallel
  tensor_state.py  which parameters are shards, and of what: read by the clip and by checkpoint.py
"""
