"""Expert parallelism for mixture-of-experts models (models/moe.py): the experts of each MoE layer are
spread over the ranks of an `ep` group and the tokens travel to them by all-to-all. One concern per module:

  all_to_all.py            the differentiable all-to-all-v (backward: the reverse exchange) and the
                           exchange of per-expert counts
  layer.py                 ExpertParallelMoE: route, sort, dispatch, local experts, combine;
                           expert_parallel(model, group) swaps it in for every MoE layer of a model
  expert_data_parallel.py  ExpertDataParallel: DDP or ZeRO-1/2 over the replicated parameters, the experts'
                           own gradient rule ([Note: expert gradients under data parallelism])
The groups come from parallel/mesh.py: Mesh(ep=P) adds the "ep" and "edp" axes inside "dp".
"""
from .all_to_all import all_to_all_v, exchange_counts
from .expert_data_parallel import ExpertDataParallel, split_expert_parameters
from .layer import ExpertParallelMoE, expert_parallel

__all__ = ["ExpertParallelMoE", "expert_parallel", "ExpertDataParallel", "split_expert_parameters", "all_to_all_v",
           "exchange_counts"]
