"""Triton kernel: group-normalised outcome advantages for ragged groups (lazy import).

Grid: one program per sample. A program leads its group if no earlier sample has the
same id; other programs exit after that check, so groups may be of any size and in any
order, and no host-side sort or `unique` (which would synchronise) is needed. The leader
1. sums each member's rewards over its real tokens (the outcome score) into `scores`,
2. computes the group mean (shifted by its own score, so equal scores give exactly 0)
   and, for MODE_STD, the unbiased standard deviation,
3. writes every member's advantage broadcast over its real tokens.
Members are found by scanning the ids `BLOCK_IDS` at a time and are then processed
`BLOCK_M` rows per tile (gathered by rank among the chunk's members), so the row work is
dense however the group is spread over the batch.
"""

import triton
import triton.language as tl

MODE_MEAN = 0  # score - mean (Dr.GRPO, REINFORCE++ baseline)
MODE_STD = 1  # (score - mean) / (std + eps) (GRPO)
MODE_RLOO = 2  # score - mean of the others = n/(n-1) * (score - mean)


@triton.jit
def _chunk_members(ids_ptr, j0, gid, num_rows, BLOCK_IDS: tl.constexpr):
    """Rows `[BLOCK_IDS]` of chunk j0, their member flags, running member rank, count."""
    rows = j0 + tl.arange(0, BLOCK_IDS)
    ids = tl.load(ids_ptr + rows, mask=rows < num_rows, other=0)
    member = (ids == gid) & (rows < num_rows)
    rank = tl.cumsum(member.to(tl.int32), axis=0)
    return rows, member, rank, tl.sum(member.to(tl.int32), axis=0)


@triton.jit
def _gather_rows(rows, member, rank, k, n, BLOCK_M: tl.constexpr):
    """The members of rank k+1 .. k+BLOCK_M: row indices `[BLOCK_M]` and a valid mask."""
    want = k + 1 + tl.arange(0, BLOCK_M)
    hit = member[None, :] & (rank[None, :] == want[:, None])
    return tl.sum(tl.where(hit, rows[None, :], 0), axis=1), want <= n


@triton.jit
def _row_scores(rewards_ptr, mask_ptr, rows, valid, num_steps, BLOCK_T: tl.constexpr):
    """Masked reward sums `[BLOCK_M]` of the given rows."""
    base = rows.to(tl.int64) * num_steps
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    for t0 in range(0, num_steps, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = valid[:, None] & (t < num_steps)[None, :]
        offs = base[:, None] + t[None, :]
        r = tl.load(rewards_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        m = tl.load(mask_ptr + offs, mask=ok, other=0) != 0
        acc += tl.sum(tl.where(m, r, 0.0), axis=1)
    return acc


@triton.jit
def _write_rows(mask_ptr, adv_ptr, rows, valid, row_adv, num_steps, BLOCK_T: tl.constexpr):
    """adv[row, t] = row_adv * mask[row, t] for the given rows."""
    base = rows.to(tl.int64) * num_steps
    for t0 in range(0, num_steps, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = valid[:, None] & (t < num_steps)[None, :]
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
    BLOCK_IDS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    me = tl.program_id(0)
    gid = tl.load(ids_ptr + me)
    n_before = tl.sum(tl.zeros([BLOCK_IDS], dtype=tl.int32), axis=0)
    for j0 in range(0, me, BLOCK_IDS):
        _, _, _, n = _chunk_members(ids_ptr, j0, gid, me, BLOCK_IDS)  # rows < me only
        n_before += n
    if n_before == 0:
        count = n_before
        for j0 in range(0, num_rows, BLOCK_IDS):
            rows, member, rank, n = _chunk_members(ids_ptr, j0, gid, num_rows, BLOCK_IDS)
            for k in range(0, n, BLOCK_M):
                sel, valid = _gather_rows(rows, member, rank, k, n, BLOCK_M)
                tl.store(
                    scores_ptr + sel,
                    _row_scores(rewards_ptr, mask_ptr, sel, valid, num_steps, BLOCK_T),
                    mask=valid,
                )
            count += n
        tl.debug_barrier()  # scores written above are re-read by other threads below
        shift = tl.load(scores_ptr + me)
        sum_dev = tl.zeros([BLOCK_IDS], dtype=tl.float32)
        for j0 in range(0, num_rows, BLOCK_IDS):
            rows, member, _, _ = _chunk_members(ids_ptr, j0, gid, num_rows, BLOCK_IDS)
            sum_dev += tl.where(
                member, tl.load(scores_ptr + rows, mask=member, other=0.0) - shift, 0.0
            )
        n_f = count.to(tl.float32)
        mean = shift + tl.sum(sum_dev, axis=0) / n_f
        # Singleton groups get advantage 0 (scale 0) instead of 0/0.
        scale = tl.where(count > 1, 1.0, 0.0)
        if MODE == 1:
            sum_sq = tl.zeros([BLOCK_IDS], dtype=tl.float32)
            for j0 in range(0, num_rows, BLOCK_IDS):
                rows, member, _, _ = _chunk_members(ids_ptr, j0, gid, num_rows, BLOCK_IDS)
                dev = tl.load(scores_ptr + rows, mask=member, other=0.0) - mean
                sum_sq += tl.where(member, dev * dev, 0.0)
            scale = scale / (tl.sqrt(tl.sum(sum_sq, axis=0) / tl.maximum(n_f - 1.0, 1.0)) + eps)
        if MODE == 2:
            scale = scale * n_f / tl.maximum(n_f - 1.0, 1.0)
        for j0 in range(0, num_rows, BLOCK_IDS):
            rows, member, rank, n = _chunk_members(ids_ptr, j0, gid, num_rows, BLOCK_IDS)
            for k in range(0, n, BLOCK_M):
                sel, valid = _gather_rows(rows, member, rank, k, n, BLOCK_M)
                row_adv = (tl.load(scores_ptr + sel, mask=valid, other=0.0) - mean) * scale
                _write_rows(mask_ptr, adv_ptr, sel, valid, row_adv, num_steps, BLOCK_T)
                tl.store(sizes_ptr + sel, count + tl.zeros([BLOCK_M], dtype=tl.int32), mask=valid)
