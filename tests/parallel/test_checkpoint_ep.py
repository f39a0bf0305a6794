"""ringzero.checkpoint across expert-parallel degrees: a 2-block MoEGPT with E = 6 experts per MoE layer, trained
2 AdamW steps at ep = 2 (2 ranks, ExpertDataParallel over ZeRO-1) and saved, then loaded at ep = 3 (3 ranks,
ExpertDataParallel over DDP), into the whole MoEGPT in ZeRO-1 over 3 ranks without ep (every expert on every
rank, flat shards that cut through experts), at ep = 1 (one process, the plain MoEGPT), and consolidated. The
ep = 1 process saves again and the 3 ranks load that too (back from ep = 1, into ExpertDataParallel over
ZeRO-1). A second case saves from Mesh(ep=2) on 4 ranks (edp = 2: two ranks hold each expert slice).

What each is compared against:
- weights: the saved model as the test puts it together from what the ep = 2 ranks held at the save
  (replicated parameters from rank 0, rank r's expert slice as experts [3r, 3r + 3)), without the checkpoint
  code. Every loaded parameter (rank r of ep = 3: experts [2r, 2r + 2)) and every consolidated tensor must be
  torch.equal to it, and the consolidated state dict loads into a fresh MoEGPT with strict=True.
- training: the ep = 2 run continued 2 steps without saving. The 2 steps after each load give the same
  losses within 1e-5 relative (float32; the ranks reduce in another order at another world size; measured
  at most 1.7e-7). The second step's loss depends on the Adam state of the first: loading every weight but
  no expert Adam state moved it by 2.3e-4, and cutting rank r's experts at [0, 2) by 1.7e-4.
  The load-balancing loss is off (aux_loss_coef=0): it is per rank's tokens, so it would differ by ep
  degree where the cross-entropy of the whole batch does not.
- Mesh(ep=2): each slice is written once (by dp ranks 0 and 1, the first of each edp pair), and consolidate
  gives every rank's weights (experts at the rank's ep index) torch.equal.
Bad input: a checkpoint whose expert count is not the model's, or is not divisible by the model's ep degree,
gives a ValueError naming both numbers before any weight is read.
"""
import functools

import pytest
import torch

from harness import run_ranks
from parallel_cases import CFG

E, SAVE_AT, TOTAL, GLOBAL = 6, 2, 4, 6  # GLOBAL: sequences per step, divisible by every ep degree used (1, 2, 3)
LR, WD = 1e-2, 0.1
REL_TOL = 1e-5


def moe_config(experts=E):
    from ringzero.models import MoEConfig
    return MoEConfig(experts=experts, top_k=2, hidden=16, activation="swiglu", aux_loss_coef=0.0)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, CFG.vocab_size, (TOTAL, GLOBAL, CFG.seq_len + 1), generator=g)


def build(world, wrap, seed, experts=E):
    """(the MoEGPT, what trains it): expert parallel over the world in ExpertDataParallel(wrap), or plain at 1;
    wrap "dp-zero1": no expert parallelism, the whole model in ZeRO-1 over the world."""
    from ringzero.models import MoEGPT
    from ringzero.parallel import DistributedDataParallel, ZeroDataParallel
    from ringzero.parallel.expert import ExpertDataParallel, expert_parallel
    torch.manual_seed(seed)
    model = MoEGPT(CFG, moe_config(experts))
    if world == 1:
        return model, model
    if wrap == "dp-zero1":
        return model, ZeroDataParallel(model, stage=1)
    wraps = {"ddp": DistributedDataParallel, "zero1": functools.partial(ZeroDataParallel, stage=1)}
    return model, ExpertDataParallel(expert_parallel(model), wrap=wraps[wrap])


def train(wrapped, opt, rank, world, first, last):
    """Steps [first, last) on this rank's share of each global batch; the global mean loss of each."""
    import torch.distributed as dist

    from ringzero.models import lm_loss
    per, losses = GLOBAL // world, []
    for batch in data()[first:last]:
        x = batch[rank * per:(rank + 1) * per]
        loss = lm_loss(wrapped(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    t = torch.tensor(losses, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    return (t / world).tolist()


def weights(model, wrapped):
    """{name: numpy copy} of the model's parameters (numpy: a tensor would reach the parent through a file
    descriptor of the rank, which has exited by then)."""
    zero = getattr(wrapped, "dense", wrapped)
    if hasattr(zero, "gather_params"):
        zero.gather_params()  # ZeRO-1: the stepped masters into the module's weights
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def tensors(arrays: dict) -> dict:
    return {n: torch.from_numpy(a) for n, a in arrays.items()}


def save_at_ep2(rank, world, root):
    from ringzero import checkpoint
    model, wrapped = build(world, "zero1", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, weight_decay=WD)
    first = train(wrapped, opt, rank, world, 0, SAVE_AT)
    checkpoint.save(root, wrapped, opt, step=SAVE_AT)
    saved = weights(model, wrapped)
    return saved, first + train(wrapped, opt, rank, world, SAVE_AT, TOTAL)


def load_at_ep1(rank, world, root, back_root, bad_root):
    from ringzero import checkpoint
    model, _ = build(1, None, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=LR * 3, weight_decay=0.0)  # hyperparameters come from the load
    assert checkpoint.load(root, model, opt)["step"] == SAVE_AT and opt.param_groups[0]["lr"] == LR
    loaded = weights(model, model)
    checkpoint.save(back_root, model, opt, step=SAVE_AT)  # the way back: a checkpoint of ep = 1
    losses = train(model, opt, rank, world, SAVE_AT, TOTAL)

    fewer, _ = build(1, None, seed=0, experts=4)
    with pytest.raises(ValueError, match=r"'blocks.0.moe.experts.w_gate' has 6 experts in the checkpoint but 4 in the "
                                         r"model"):
        checkpoint.load(root, fewer)
    checkpoint.save(bad_root, fewer)  # 4 experts: ep = 3 does not divide them
    return loaded, losses


def cuts_through_an_expert(zero) -> bool:
    """Whether a shard boundary of ZeRO's flat groups falls inside one expert of a stacked expert tensor."""
    for g in zero.groups:
        layout = g.layout
        for s in layout.slots:
            cuts = [k * layout.shard_numel - s.offset for k in range(1, layout.world)]
            if is_expert(s.name) and any(0 < c < s.numel and c % (s.numel // E) for c in cuts):
                return True
    return False


def load_at_ep3(rank, world, root, back_root, bad_root):
    from ringzero import checkpoint
    results = {}
    for name, path, wrap in [("from ep 2", root, "ddp"), ("back from ep 1", back_root, "zero1"),
                             ("from ep 2 into ZeRO-1 without ep", root, "dp-zero1")]:
        model, wrapped = build(world, wrap, seed=4)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=LR * 3, weight_decay=0.0)
        assert wrap != "dp-zero1" or cuts_through_an_expert(wrapped)
        checkpoint.load(path, wrapped, opt)
        results[name] = weights(model, wrapped), train(wrapped, opt, rank, world, SAVE_AT, TOTAL)

    _, more = build(world, "ddp", seed=0, experts=9)
    with pytest.raises(ValueError, match=r"has 6 experts in the checkpoint but 9 in the model"):
        checkpoint.load(root, more)
    _, six = build(world, "ddp", seed=0)
    with pytest.raises(ValueError, match=r"has 4 experts in the checkpoint, which the model's ep=3 does not divide; "
                                         r"the model has 6 experts"):
        checkpoint.load(bad_root, six)
    return results


def is_expert(name):
    return ".moe.experts." in name


def expect_equal(got: dict, want: dict, what: str):
    assert got.keys() == want.keys(), what
    wrong = [n for n in want if not torch.equal(got[n], want[n])]
    assert not wrong, f"{what}: not equal: {wrong}"


def expect_losses(got, want, what):
    errors = [abs(a - b) / abs(b) for a, b in zip(got, want)]
    assert len(got) == len(want) and max(errors) <= REL_TOL, f"{what}: {got} vs {want}"
    print(f"{what}: losses within {max(errors):.1e} relative")


def test_save_at_ep2_load_at_ep3_and_ep1_and_consolidate(tmp_path):
    root, back_root, bad_root = (str(tmp_path / d) for d in ("ckpt", "back", "bad"))
    saved = [(tensors(w), losses) for w, losses in run_ranks(2, save_at_ep2, root, timeout_s=120)]
    per = E // 2
    whole = {n: torch.cat([saved[r][0][n] for r in range(2)]) if is_expert(n) else saved[0][0][n] for n in saved[0][0]}
    assert all(whole[n].shape[0] == E for n in whole if is_expert(n))
    assert all(torch.equal(saved[r][0][n], whole[n][r * per:(r + 1) * per]) for r in range(2) for n in whole
               if is_expert(n))
    uninterrupted = saved[0][1][SAVE_AT:]

    loaded, losses = run_ranks(1, load_at_ep1, root, back_root, bad_root, timeout_s=120)[0]
    expect_equal(tensors(loaded), whole, "ep 1")
    expect_losses(losses, uninterrupted, "ep 2 -> ep 1")

    for rank, results in enumerate(run_ranks(3, load_at_ep3, root, back_root, bad_root, timeout_s=120)):
        for name, (params, losses) in results.items():
            per = E // 3
            sliced = "without ep" not in name
            want = {n: w[rank * per:(rank + 1) * per] if is_expert(n) and sliced else w for n, w in whole.items()}
            expect_equal(tensors(params), want, f"ep 3 rank {rank}, {name}")
            if rank == 0:
                expect_losses(losses, uninterrupted, f"ep 3, {name}")

    from ringzero import checkpoint
    from ringzero.models import MoEGPT
    state = checkpoint.consolidate(root)
    expect_equal(state, whole, "consolidate")
    torch.manual_seed(5)
    plain = MoEGPT(CFG, moe_config())
    plain.load_state_dict(state, strict=True)
    expect_equal(dict(plain.named_parameters()), whole, "the plain MoEGPT loaded with the consolidated state")


def save_from_mesh(rank, world, root):
    from ringzero import checkpoint
    from ringzero.models import MoEGPT
    from ringzero.parallel import DistributedDataParallel, Mesh
    from ringzero.parallel.expert import ExpertDataParallel, expert_parallel
    mesh = Mesh(ep=2)
    torch.manual_seed(0)
    model = expert_parallel(MoEGPT(CFG, moe_config()), mesh.group("ep"))
    wrapped = ExpertDataParallel(model, mesh.group("dp"), mesh.group("edp"), wrap=DistributedDataParallel)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, weight_decay=WD)
    train(wrapped, opt, rank, world, 0, 1)
    checkpoint.save(root, wrapped, opt, step=1)
    return mesh.index("ep"), weights(model, wrapped)


def test_save_from_ep2_times_edp2_writes_each_expert_slice_once(tmp_path):
    import json

    from ringzero import checkpoint
    root = tmp_path / "ckpt"
    ranks = run_ranks(4, save_from_mesh, str(root), timeout_s=120)
    manifest = json.loads((root / "step-00000001" / "manifest.json").read_text())
    writers = [(g["files"], g["experts"]["first"]) for g in manifest["groups"] if "experts" in g]
    assert writers and all(files == [f"rank{first // 3:05d}.pt"] for files, first in writers), writers
    state = checkpoint.consolidate(root)
    for ep_index, arrays in ranks:
        want = {n: w[ep_index * 3:(ep_index + 1) * 3] if is_expert(n) else w for n, w in state.items()}
        expect_equal(tensors(arrays), want, f"ep index {ep_index}")
