"""Data parallelism: every rank holds the whole model (or, under ZeRO, a shard of its state) and a slice
of the batch. One concern per module:

  ddp.py            DistributedDataParallel: bucketed gradient all-reduce overlapped with backward
  zero.py           ZeroDataParallel (stages 1-3): float32 master shards; delegates to one ZeroSharding
  zero_sharding.py  the interface between ZeroDataParallel and its sharding, and their shared gradient path
  zero_buckets.py   stages 1 and 2: weights gathered in flat buckets, optimizer state (and gradients) sharded
  zero_units.py     stage 3: weights sharded in units, gathered before their forward and backward
  sharded_group.py  one ZeRO flat group: master shard, gather of full weights, reduction of gradients
  zero_comm.py      a flat group's communication as swappable parts: the plain gather and reduce-scatter
  zeropp.py         ZeRO++'s options for stage 3 across hosts: the hosts' subgroups, the quantized reduce-scatter,
                    and the choice of every group's communication forms from the options
  zeropp_gather.py  ZeRO++'s gathers: hpz's in-host secondary, qw's int8 weights (one host, across hosts)
  quantize.py       block quantization (int8, int4) for zeropp, over the C++ kernels
  flat.py           flat layouts: parameters end to end in one 1-D buffer, a contiguous shard per rank
  grad_ready.py     counts gradients as autograd produces them; starts reductions in a fixed order
  clip.py           global gradient-norm clipping over gradients spread across ranks
"""
