"""Triton kernel: group-normalised outcome advantages for ragged groups (lazy import).

Grid: one program per sample. A program leads its group if no earlier sample has the
same id; other programs exit after that check, so groups may be of any size and in any
order, and no host-side sort or `unique` (which would synchronise) is needed. The leader
1. sums each member's rewards over its real tokens (the outcome score) into `scores`,
2. computes the group mean (shifted by its own score, so equal scores give exactly 0)
   and, for MODE_STD, the unbiased standard deviation,
3. writes every member's advantage broadcast over its real tokens.
"""

import triton
import triton.language as tl

MODE_MEAN = 0  # score - mean (Dr.GRPO, REINFORCE++ baseline)
MODE_STD = 1  # (score - mean) / (std + eps) (GRPO)
MODE_RLOO = 2  # score - mean of the others = n/(n-1) * (score - mean)


@triton.jit
def _member_scores(rewards_ptr, mask_ptr, rows, member, num_steps, BLOCK_T: tl.constexpr):
    """Masked reward sums `[BLOCK_N]` of the member rows."""
    base = rows.to(tl.int64) * num_steps
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    for t0 in range(0, num_steps, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = member[:, None] & (t < num_steps)[None, :]
        offs = base[:, None] + t[None, :]
        r = tl.load(rewards_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        m = tl.load(mask_ptr + offs, mask=ok, other=0) != 0
        acc += tl.sum(tl.where(m, r, 0.0), axis=1)
    return acc


@triton.jit
def _write_advantages(mask_ptr, adv_ptr, rows, member, row_adv, num_steps, BLOCK_T: tl.constexpr):
    """adv[row, t] = row_adv * mask[row, t] for the member rows."""
    base = rows.to(tl.int64) * num_steps
    for t0 in range(0, num_steps, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = member[:, None] & (t < num_steps)[None, :]
        offs = base[:, None] + t[None, :]
        m = tl.load(mask_ptr + offs, mask=ok, other=0) != 0
        tl.store(adv_ptr + offs, tl.where(m, row_adv[:, None], 0.0), mask=ok)


@triton.jit
def group_adv_kernel(
    rewards_ptr,
    mask_ptr,
    ids_ptr,
    adv_ptr,
    scores_ptr,
    sizes_ptr,
    num_rows,
    num_steps,
    eps,
    MODE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    me = tl.program_id(0)
    gid = tl.load(ids_ptr + me)
    n_before = tl.sum(tl.zeros([BLOCK_N], dtype=tl.int32), axis=0)
    for j0 in range(0, me, BLOCK_N):
        rows = j0 + tl.arange(0, BLOCK_N)
        ids = tl.load(ids_ptr + rows, mask=rows < me, other=0)
        n_before += tl.sum(((ids == gid) & (rows < me)).to(tl.int32), axis=0)
    if n_before == 0:
        count = n_before  # int32 zero
        for j0 in range(0, num_rows, BLOCK_N):
            rows = j0 + tl.arange(0, BLOCK_N)
            ids = tl.load(ids_ptr + rows, mask=rows < num_rows, other=0)
            member = (ids == gid) & (rows < num_rows)
            n_members = tl.sum(member.to(tl.int32), axis=0)
            if n_members > 0:
                s = _member_scores(rewards_ptr, mask_ptr, rows, member, num_steps, BLOCK_T)
                tl.store(scores_ptr + rows, s, mask=member)
                count += n_members
        tl.debug_barrier()  # scores written above are re-read by other threads below
        shift = tl.load(scores_ptr + me)
        sum_dev = tl.zeros([BLOCK_N], dtype=tl.float32)
        for j0 in range(0, num_rows, BLOCK_N):
            rows = j0 + tl.arange(0, BLOCK_N)
            ids = tl.load(ids_ptr + rows, mask=rows < num_rows, other=0)
            member = (ids == gid) & (rows < num_rows)
            s = tl.load(scores_ptr + rows, mask=member, other=0.0)
            sum_dev += tl.where(member, s - shift, 0.0)
        n = count.to(tl.float32)
        mean = shift + tl.sum(sum_dev, axis=0) / n
        sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
        if MODE == 1:
            for j0 in range(0, num_rows, BLOCK_N):
                rows = j0 + tl.arange(0, BLOCK_N)
                ids = tl.load(ids_ptr + rows, mask=rows < num_rows, other=0)
                member = (ids == gid) & (rows < num_rows)
                s = tl.load(scores_ptr + rows, mask=member, other=0.0)
                sum_sq += tl.where(member, (s - mean) * (s - mean), 0.0)
        # Singleton groups get advantage 0 (scale 0) instead of 0/0.
        scale = tl.where(count > 1, 1.0, 0.0)
        if MODE == 1:
            std = tl.sqrt(tl.sum(sum_sq, axis=0) / tl.maximum(n - 1.0, 1.0))
            scale = scale / (std + eps)
        if MODE == 2:
            scale = scale * n / tl.maximum(n - 1.0, 1.0)
        for j0 in range(0, num_rows, BLOCK_N):
            rows = j0 + tl.arange(0, BLOCK_N)
            ids = tl.load(ids_ptr + rows, mask=rows < num_rows, other=0)
            member = (ids == gid) & (rows < num_rows)
            if tl.sum(member.to(tl.int32), axis=0) > 0:
                s = tl.load(scores_ptr + rows, mask=member, other=0.0)
                _write_advantages(mask_ptr, adv_ptr, rows, member, (s - mean) * scale, num_steps, BLOCK_T)
                tl.store(sizes_ptr + rows, count + tl.zeros([BLOCK_N], dtype=tl.int32), mask=member)
