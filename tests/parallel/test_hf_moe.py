"""The expert-parallel plan of Hugging Face mixture-of-experts models (parallelize(model, mesh, plan="ep"),
parallel/hf/hf_expert.py) against the unsharded transformers model in one process.

Reference: the same tiny random model (models/hf.py's build_hf_moe_model, the same seed) whole in each
rank's own process, run on every rank's slice of the batch in turn (transformers' labels= loss with
output_router_logits=True: cross-entropy plus router_aux_loss_coef times the load-balancing loss, which
like each rank's is per forward call), the step's loss the mean over the slices; torch.optim.AdamW on it.
The sharded model is wrapped in ExpertDataParallel around ringzero's DDP (the replicated parameters
averaged over dp, the experts' gradients scaled to the mean over dp).
- Mixtral (top-2, renormalised) and Qwen2-MoE (raw top-2 probabilities, a shared expert behind a sigmoid
  gate, one dense layer among three) at ep = 2 on 2 ranks, Mixtral at Mesh(dp=4, ep=2) on 4 ranks (two ep
  groups, experts averaged over edp): each rank's logits, loss and aux_loss against the reference's on
  its slice, the mean loss, every replicated parameter's gradient and each expert gradient against the
  matching slice of the reference's, rtol=1e-5, atol=1e-6 (float32) [largest differences printed, pytest -s].
- training: 3 AdamW steps; the mean loss of every step within 1e-5 relative of the reference's, and after
  them the router's and this rank's experts' weights within atol=1e-4 (1% of the learning rate: Adam's
  m / sqrt(v) turns last-bit differences of near-zero gradients into visible ones).
- refusals: a dense model, a model whose layers are all dense, E not divisible by ep, a mesh without an
  ep axis or with tp > 1, sequence_parallel=True: ValueError naming the problem, the model left as it was.
"""
import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

transformers = pytest.importorskip("transformers", reason="the Hugging Face plans need transformers "
                                                          "(pip install ringzero[hf])")
MISSING = [n for n in ("MixtralForCausalLM", "Qwen2MoeForCausalLM") if not hasattr(transformers, n)]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"transformers {transformers.__version__} lacks {MISSING}")

RTOL, ATOL = 1e-5, 1e-6
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4
MODEL_SEED, DATA_SEED = 0, 1
PER_RANK, STEPS, LR = 2, 3, 1e-2

MIXTRAL = dict(family="mixtral", layers=2, d_model=32, heads=4, kv_heads=2, experts=4, top_k=2, expert_hidden=48,
               vocab=128, seq=16)
QWEN2_MOE = dict(family="qwen2_moe", layers=3, d_model=32, heads=4, kv_heads=2, experts=4, top_k=2,
                 expert_hidden=48, vocab=128, seq=16, mlp_only_layers=[1])


def build(cfg, **over):
    from ringzero.models.hf import build_hf_moe_model
    return build_hf_moe_model(**{**cfg, **over}, seed=MODEL_SEED)


def slices(cfg, world, step):
    """The step's batch cut into `world` slices of PER_RANK sequences (rank r's is slice r)."""
    g = torch.Generator().manual_seed(DATA_SEED + step)
    tokens = torch.randint(0, cfg["vocab"], (world * PER_RANK, cfg["seq"]), generator=g)
    return tokens.split(PER_RANK)


def worst(got, want):
    """Largest |got - want| / (ATOL + RTOL |want|): below 1 passes assert_close's rule."""
    return float(((got - want).abs() / (ATOL + RTOL * want.abs())).max())


def expert_slice(name, full, model):
    """The part of the reference parameter `full` that this rank's parameter `name` holds."""
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        shard = model.get_submodule(name.rpartition(".")[0])
        return full[shard.first_expert: shard.first_expert + shard.local_count]
    return full


def sharded(cfg, mesh):
    from ringzero.parallel import ExpertDataParallel, parallelize
    model = parallelize(build(cfg), mesh, plan="ep")
    return model, ExpertDataParallel(model, mesh.group("dp"), mesh.group("edp"))


def parity(mesh, cfg, label):
    """One forward/backward of the sharded model on this rank's slice against the reference."""
    from ringzero.parallel.hf.hf_expert import ExpertParallelHFExperts
    dp, r = mesh.size("dp"), mesh.index("dp")
    xs = slices(cfg, dp, 0)
    ref = build(cfg)
    ref_out = [ref(x, labels=x) for x in xs]
    torch.stack([o.loss for o in ref_out]).mean().backward()
    model, wrapped = sharded(cfg, mesh)
    shards = [m for m in model.modules() if isinstance(m, ExpertParallelHFExperts)]
    moe_layers = cfg["layers"] - len(cfg.get("mlp_only_layers", []))
    assert len(shards) == moe_layers and all(s.local_count == cfg["experts"] // mesh.size("ep") for s in shards)
    out = wrapped(xs[r], labels=xs[r])
    out.loss.backward()
    want = ref_out[r]
    ratio = 0.0
    for what, got, ref_value in (("logits", out.logits, want.logits), ("loss", out.loss, want.loss),
                                 ("aux_loss", out.aux_loss, want.aux_loss)):
        ratio = max(ratio, worst(got, ref_value))
        torch.testing.assert_close(got, ref_value, rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} {what}: {s}")
    mean = out.loss.detach().clone()
    dist.all_reduce(mean)  # gloo: the sum over dp
    torch.testing.assert_close(mean / dp, torch.stack([o.loss for o in ref_out]).mean().detach(), rtol=RTOL, atol=ATOL)
    ref_params = dict(ref.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        expected = expert_slice(name, ref_params[name].grad, model)
        ratio = max(ratio, worst(p.grad, expected))
        torch.testing.assert_close(p.grad, expected, rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} {name} grad: {s}")
        checked += 1
    assert checked == len(ref_params), f"{label}: {checked} parameters checked of {len(ref_params)}"
    return ratio


def training(mesh, cfg, label):
    """STEPS AdamW steps of the sharded model and of the reference on the same batches."""
    dp, r = mesh.size("dp"), mesh.index("dp")
    ref = build(cfg)
    model, wrapped = sharded(cfg, mesh)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    rel = 0.0
    for step in range(STEPS):
        xs = slices(cfg, dp, step)
        ref_loss = torch.stack([ref(x, labels=x).loss for x in xs]).mean()
        loss = wrapped(xs[r], labels=xs[r]).loss
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        rel = max(rel, abs(float(mean) / dp - float(ref_loss)) / abs(float(ref_loss)))
        assert rel <= LOSS_RTOL, f"{label} step {step}: mean loss {float(mean) / dp} vs {float(ref_loss)}"
        for o, l in ((ref_opt, ref_loss), (opt, loss)):
            o.zero_grad()
            l.backward()
            o.step()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if name.endswith(("mlp.gate.weight", "experts.gate_up_proj", "experts.down_proj")):
            torch.testing.assert_close(p, expert_slice(name, ref_params[name], model), rtol=0, atol=PARAM_ATOL,
                                       msg=lambda s: f"{label} {name} after {STEPS} steps: {s}")
    return rel


def refusals(mesh):
    from ringzero.models import build_hf_model
    from ringzero.parallel import Mesh, parallelize
    cases = [(lambda: build_hf_model("llama", d_model=32, heads=4, vocab=128, seq=16, seed=0), mesh, {},
              "no sparse MoE blocks"),
             (lambda: build(QWEN2_MOE, layers=2, mlp_only_layers=[0, 1]), mesh, {}, "has no sparse MoE block"),
             (lambda: build(MIXTRAL, experts=3), mesh, {}, "num_local_experts=3 experts are not divisible by .* ep=2"),
             (lambda: build(MIXTRAL), Mesh(dp=2), {}, "needs an ep axis"),
             (lambda: build(MIXTRAL), Mesh(tp=2), {}, "tp=1"),
             (lambda: build(MIXTRAL), mesh, {"sequence_parallel": True}, "sequence_parallel")]
    for make, on, kwargs, words in cases:
        model = make()
        before = [type(m).__name__ for m in model.modules()]
        with pytest.raises(ValueError, match=words):
            parallelize(model, on, plan="ep", **kwargs)
        assert [type(m).__name__ for m in model.modules()] == before, f"{words}: model changed"
        assert getattr(model, "ringzero_parallel", None) is None
    return len(cases)


def two_ranks(rank, world):
    from ringzero.parallel import Mesh
    mesh = Mesh(ep=2)
    seen = {}
    for cfg in (MIXTRAL, QWEN2_MOE):
        label = f"{cfg['family']} ep=2"
        seen[label] = parity(mesh, cfg, label)
        seen[f"{label} AdamW loss rel"] = training(mesh, cfg, label)
    seen["refusals"] = refusals(mesh)
    return seen


def four_ranks(rank, world):
    from ringzero.parallel import Mesh
    mesh = Mesh(ep=2)
    assert mesh.size("edp") == 2
    label = "mixtral dp=4 = ep 2 x edp 2"
    return {label: parity(mesh, MIXTRAL, label), f"{label} AdamW loss rel": training(mesh, MIXTRAL, label)}


def test_two_ranks():
    results = run_ranks(2, two_ranks, timeout_s=300)
    print(results)
    assert results[0]["refusals"] == 6


def test_four_ranks_expert_and_data_parallel():
    results = run_ranks(4, four_ranks, timeout_s=300)
    print(results)
