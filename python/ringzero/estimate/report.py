"""Plain-text tables of an Estimate: memory per GPU, communication per step, collective times."""
from __future__ import annotations

from .communication import cross_host_bytes
from .core import Estimate, optimizer_bytes_per_param
from .moe import active_params
from .network import ALGORITHMS


def fmt_bytes(n: float | None) -> str:
    """Decimal units (GB = 1e9 bytes), as the ZeRO paper and GPU datasheets count."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def memory_lines(est: Estimate) -> list[str]:
    st, prec, plan = est.peak, est.precision, est.plan
    where = f"; the fullest pipeline stage is {st.stage} of 0..{plan.pp - 1}" if plan.pp > 1 else ""
    z, count = plan.zero_stage, fmt_count(st.params)
    split = f"; experts / {plan.edp}" if st.expert_params and plan.edp != plan.dp else ""  # ZeRO over edp for them
    held = lambda sharded: f"{count} / {plan.dp} ranks{split}" if sharded else f"{count} (all)"  # noqa: E731
    lines = [f"memory per GPU (GB = 1e9 bytes{where})",
             f"  {'term':<44} {'B/param':>7}  {'parameters held':<20} {'bytes':>11}"]
    for name, per, sharded, nbytes in (("parameters", prec.param_bytes, z >= 3, st.param_bytes),
                                       ("gradients", prec.grad_bytes, z >= 2, st.grad_bytes),
                                       ("optimizer state (master copy and moments)", optimizer_bytes_per_param(prec, plan), z >= 1,
                                        st.optimizer_bytes)):
        lines.append(f"  {name:<44} {per:>7}  {held(sharded):<20} {fmt_bytes(nbytes):>11}")
    if st.expert_params:
        lines.append(_expert_line(est))
    width = 75
    if st.activation_bytes is None:
        lines.append(f"  {'activations':<{width}}{'-':>11}")
    else:
        lines.append(f"  {f'activations ({est.micro_batch} sequences per micro-batch)':<{width}}"
                     f"{fmt_bytes(st.activation_bytes):>11}")
        lines += [f"    {name:<{width - 2}}{fmt_bytes(b):>11}" for name, b in st.activation_terms.items()]
        lines.append(f"    formula: {est.activation_formula}")
        m = est.model
        if (m.mlp, m.norm, m.kv, m.width) != ("gelu", "layer", m.n_head, m.mlp_ratio * m.d_model):
            lines.append("    taken term by term for this shape (its MLP, norms and key/value heads): "
                         "ModelShape.layer_activation_bytes")
        lines.append(f"    applied with: attention {est.model.attention}, dropout "
                     f"{'on' if est.model.dropout else 'off'}, {prec.act_bytes}-byte activations, "
                     f"recompute {plan.recompute}" + _tensor_note(plan))
    for name, b in st.transient_terms.items():
        lines.append(f"  {'transient: ' + name:<{width}}{fmt_bytes(b):>11}")
    lines.append(f"  {'total':<{width}}{fmt_bytes(st.total_bytes):>11}")
    lines.append("  (all terms at once: gradients counted as allocated throughout, as bucketed reductions keep them)")
    return lines


def _expert_line(est: Estimate) -> str:
    """The experts' share of the parameters row: E / ep experts per MoE block on this rank, ZeRO-3 sharding
    them over the edp ranks holding the same experts."""
    st, plan, moe = est.peak, est.plan, est.model.moe
    count = fmt_count(st.expert_params) + (f" / {plan.edp} ranks" if plan.zero_stage >= 3 else " (all)")
    name = f"of which experts ({moe.experts // plan.ep} of {moe.experts} x {st.moe_blocks} MoE blocks)"
    nbytes = -(-st.expert_params // (plan.edp if plan.zero_stage >= 3 else 1)) * est.precision.param_bytes
    return f"  {name:<44} {est.precision.param_bytes:>7}  {count:<20} {fmt_bytes(nbytes):>11}"


def comm_lines(est: Estimate) -> list[str]:
    if not est.collectives:
        return ["communication per step: none (one rank per stage, one stage)"]
    lines = ["communication per step, per rank (buffer as nccl-tests counts it; sent = ring algorithm)",
             f"  {'what':<48} {'op':<15} {'group':>7} {'buffer':>11} {'calls':>6} {'sent':>11}"]
    for c in est.collectives:
        lines.append(f"  {c.what:<48} {c.op:<15} {c.group + ' x' + str(c.group_size):>7} {fmt_bytes(c.nbytes):>11} "
                     f"{c.calls:>6} {fmt_bytes(c.sent_per_rank):>11}")
    lines.append(f"  {'total sent per rank per step':<90}{fmt_bytes(est.sent_per_rank):>11}")
    across = cross_host_bytes(est)
    if across is not None:
        lines.append(f"  {'sent by each host to the others per step (' + str(est.plan.ranks_per_host) + ' ranks per host)':<90}"
                     f"{fmt_bytes(across):>11}")
    return lines


def time_lines(est: Estimate) -> list[str]:
    if est.cluster is None or not est.collectives:
        return []
    lines = [f"time per step by the alpha-beta model on {est.cluster.name} (* = fastest; '-' = does not apply)",
             f"  {'what':<48}" + "".join(f"{a:>14}" for a in ALGORITHMS)]
    for c in est.collectives:
        cells = []
        for a in ALGORITHMS:
            t = c.times_s.get(a)
            cells.append(f"{(fmt_time(t) + ('*' if a == c.best else ' ')) if t is not None else '- ':>14}")
        lines.append(f"  {c.what:<48}" + "".join(cells))
    lines.append(f"  total with the fastest of each, not overlapped with compute: {fmt_time(est.comm_time_s)}")
    return lines


def header_lines(est: Estimate) -> list[str]:
    active = f" ({fmt_count(active_params(est.model))} active)" if est.model is not None and est.model.moe else ""
    model = (f"{est.model.describe()} = {fmt_count(est.n_params)} parameters{active}" if est.model is not None
             else f"{fmt_count(est.n_params)} parameters (count only)")
    batch = (f"; batch {est.batch} sequences per step ({est.micro_batch} per micro-batch)"
             if est.batch is not None else "")
    lines = [f"model      {model}", f"precision  {est.precision.describe()}",
             f"plan       world {est.plan.world}: {est.plan.describe()}{batch}"]
    if est.cluster is not None:
        lines.append(f"cluster    {est.cluster.describe()}")
    return lines


def full_report(est: Estimate) -> str:
    parts = [header_lines(est), memory_lines(est), comm_lines(est), time_lines(est)]
    if est.notes:
        parts.append(["notes"] + [f"  {n}" for n in est.notes])
    return "\n\n".join("\n".join(p) for p in parts if p)


def _tensor_note(plan) -> str:
    """How tensor (and sequence) parallelism entered the activation formula, for the report."""
    if plan.tp == 1:
        return ""
    form = "sbh/t (34 + 5as/h)" if plan.sequence_parallel else "sbh(10 + 24/t + 5as/(ht))"
    sp = " with sequence parallelism" if plan.sequence_parallel else ""
    return f", tensor parallel t={plan.tp}{sp} (the paper's Table 2: {form} at 16 bits with dropout)"


def summary_table(estimates: list[Estimate]) -> str:
    """One row per strategy: the memory terms of its fullest stage, traffic and time per step."""
    head = (f"{'strategy':<10} {'pp':>3} {'tp':>3} {'dp':>4} {'params':>10} {'grads':>10} {'optim':>10} {'activ':>10} "
            f"{'transient':>10} {'total':>10} {'sent/rank':>10} {'comm time':>10}")
    rows = [head]
    for e in estimates:
        st = e.peak
        rows.append(f"{e.plan.strategy:<10} {e.plan.pp:>3} {e.plan.tp:>3} {e.plan.dp:>4} {fmt_bytes(st.param_bytes):>10} "
                    f"{fmt_bytes(st.grad_bytes):>10} {fmt_bytes(st.optimizer_bytes):>10} "
                    f"{fmt_bytes(st.activation_bytes):>10} {fmt_bytes(st.transient_bytes):>10} "
                    f"{fmt_bytes(st.total_bytes):>10} {fmt_bytes(e.sent_per_rank):>10} {fmt_time(e.comm_time_s):>10}")
    return "\n".join(rows)
