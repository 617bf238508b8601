"""Link-prediction evaluation on a torch device: the twin of the Rust evaluator's scoring.

``strata_embed``'s evaluator (``eval/``) decides everything a rank depends on: the queries,
the candidates of each (a partition's rows, an answer type's section, a sampled batch), the
ones that do not compete (the answer itself, the other known answers when filtered, another
type's candidates) and the tie rule (``rank = 1 + above + equal / 2``). For a run evaluated with
a ``device`` other than ``cpu`` it hands each block of candidates to :meth:`TorchRanker.count`,
which scores the queries against them as matrix products on the device, in tiles that fit
:data:`TILE_BYTES`, and returns only the counts.

The scores are the Rust models' arithmetic in float32 (TransE-L2 expanded into matrix
products as the Rust scorer does; TransE-L1 and RotatE pair by pair). Matrix products run in
full float32 (torch's default: TF32 off), since ranks compare scores that may differ in the
last bits; where a candidate's score is within float rounding of the answer's, the device and
the CPU may order them differently.
"""

from __future__ import annotations

import warnings

import torch

from strata.embed.device import step
from strata.embed.device.backend import TILE_BYTES, resolve

#: Candidates per tile when the queries fill the budget (the Rust evaluator's ``TILE``).
TILE_ROWS = 4096


def _tensor(buf, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A lent read-only buffer as a tensor on ``device`` (a copy; empty buffers allowed)."""
    if len(buf) == 0:
        return torch.empty(0, dtype=dtype, device=device)
    with warnings.catch_warnings():
        # The buffers are lent read-only; torch warns that it cannot mark its view so.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(buf, dtype=dtype)
    # A copy either way: the view is released when the call returns.
    return t.to(device, copy=True)


def _u32(buf, device: torch.device) -> torch.Tensor:
    """A lent buffer of u32 values as int64 on ``device`` (read as int32, whose negative
    values are those of 2^31 and over)."""
    return _tensor(buf, torch.int32, device).long() & 0xFFFF_FFFF


def candidate_scores(
    model: str, transe_norm: int, comparator: str | None, a: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """Scores (``q x n``) of query rows ``a = phi(s, r)`` (``q x dim``) against candidate rows
    ``c`` (``n x dim``), as ``score_candidates`` computes them (``comparator``: a ``pbg``
    model's)."""
    if model == "pbg":
        return step.pbg_scores(comparator, a, c)[1]
    if model in ("dot", "distmult", "complex"):
        return a @ c.T
    if model == "transe" and transe_norm == 2:
        return -(step.squared_distances(a, c) + step.EPS).sqrt()
    diff = a[:, None, :] - c[None, :, :]
    if model == "transe":
        return -diff.abs().sum(2)
    h = a.shape[1] // 2
    return -((diff[..., :h] ** 2 + diff[..., h:] ** 2 + step.EPS).sqrt()).sum(2)


class TorchRanker:
    """Scores and counts blocks of candidates on a torch device."""

    def __init__(self, device: str):
        self.device = resolve(device)
        self.budget = TILE_BYTES["cuda" if self.device.type == "cuda" else "cpu"]

    def count(self, job: dict) -> tuple[list[int], list[int]]:
        """``(above, equal)`` per query of ``job`` (``RankJob``'s fields): query ``i`` against
        candidates ``lo[i] .. hi[i]``, its run of ``excluded_per_query[i]`` candidates of
        ``excluded_cand`` left out; a NaN true score has every competing candidate above."""
        model, dim = job["model"], job["dim"]
        step.check_model(model)
        dev = self.device
        true = _tensor(job["true_score"], torch.float32, dev)
        q = len(true)
        query = step.query_model(model, job["operator"])
        src = _tensor(job["src"], torch.float32, dev).view(q, dim)
        rel = _tensor(job["rel"], torch.float32, dev).view(q, step.rel_dim(query, dim))
        cand_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[job["cands_dtype"]]
        # bf16 rows widen exactly, on the device.
        cands = _tensor(job["cands"], cand_dtype, dev).view(job["n"], dim).float()
        lo = _tensor(job["lo"], torch.int64, dev)
        hi = _tensor(job["hi"], torch.int64, dev)
        # The excluded pairs (query, candidate), the queries expanded on the device.
        per_query, ex_c = _u32(job["excluded_per_query"], dev), _u32(job["excluded_cand"], dev)
        ex_q = torch.repeat_interleave(torch.arange(q, device=dev), per_query, output_size=len(ex_c))
        phi = step.combine(query, src, rel)
        above = torch.zeros(q, dtype=torch.int64, device=dev)
        equal = torch.zeros(q, dtype=torch.int64, device=dev)
        # Queries sharing a range are scored together: one group when filtered without types,
        # one per answer type with them, one per batch when sampled.
        spans, group_of = torch.unique(torch.stack([lo, hi], 1), dim=0, return_inverse=True)
        for g, (a, z) in enumerate(spans.tolist()):
            if z <= a:
                continue
            queries = (group_of == g).nonzero().squeeze(1)
            mine = (group_of[ex_q] == g) if len(ex_q) else ex_q.bool()
            excluded = (ex_q[mine], ex_c[mine])
            scorer = (model, job["transe_norm"], job["comparator"])
            self._group(scorer, phi, true, cands, queries, (a, z), excluded, (above, equal))
        return above.tolist(), equal.tolist()

    def _tiles(self, kind: str, dim: int, queries: int, width: int) -> tuple[int, int]:
        """``(queries, candidates)`` per tile within the budget (``kind``: the model, or
        ``transe_l1``, whose differences are held pair by pair as RotatE's)."""
        pairwise = kind in ("rotate", "transe_l1")
        per_pair = 16 + (8 * dim if pairwise else 0)
        pairs = max(1, self.budget // per_pair)
        rows = min(width, TILE_ROWS)
        qc = max(1, min(queries, pairs // rows))
        if qc == queries:
            rows = min(width, max(rows, pairs // qc))
        return qc, rows

    def _group(self, scorer, phi, true, cands, queries, span, excluded, counts) -> None:
        """Counts the queries ``queries`` against candidates ``span`` (``a .. z``) into
        ``counts`` (``above``, ``equal``) with ``scorer`` (:func:`candidate_scores`' model,
        TransE norm and comparator); ``excluded`` (queries, candidates) are the group's pairs
        that do not compete."""
        (a, z), (ex_q, ex_c), (above, equal) = span, excluded, counts
        model, transe_norm, _ = scorer
        kind = "transe_l1" if model == "transe" and transe_norm != 2 else model
        qc, rows = self._tiles(kind, phi.shape[1], len(queries), z - a)
        # Where each query sits in its chunk of the group (-1: another chunk).
        slot = torch.full((len(true),), -1, dtype=torch.int64, device=phi.device)
        for q0 in range(0, len(queries), qc):
            chunk = queries[q0 : q0 + qc]
            slot[chunk] = torch.arange(len(chunk), device=phi.device)
            in_chunk = slot[ex_q] >= 0
            cq, cc = slot[ex_q[in_chunk]], ex_c[in_chunk]
            s = true[chunk][:, None]
            nan = s.isnan()
            for c0 in range(a, z, rows):
                c1 = min(z, c0 + rows)
                scores = candidate_scores(*scorer, phi[chunk], cands[c0:c1])
                keep = torch.ones_like(scores, dtype=torch.bool)
                here = (cc >= c0) & (cc < c1)
                keep[cq[here], cc[here] - c0] = False
                above[chunk] += (((scores > s) | nan) & keep).sum(1)
                equal[chunk] += ((scores == s) & keep).sum(1)
            slot[chunk] = -1
