"""The torch backend of the compute seam: the Rust epoch loop hands it each piece of a bucket.

``strata_embed``'s epoch loop (ordering, partition buffer, I/O, run format) stays in Rust; a job
trained with ``device`` other than ``cpu`` calls :meth:`TorchCompute.train_piece` for every
piece, with the resident partition slots lent as writable host buffers. On ``cuda`` the slots
a piece touches are copied to the device on a separate copy stream, trained there and copied
back before the call returns (the seam's contract: the epoch loop writes slots to the table
files right after). On ``torch-cpu`` (the CPU twin, for machines without a GPU and for the
parity tests) the same code trains the host buffers in place.
"""

from __future__ import annotations

import time
import warnings

import torch

from strata.device import rng
from strata.embed.device import step


def resolve(device: str) -> torch.device:
    """The torch device of a ``device`` option: ``cuda``, ``cuda:N`` or ``torch-cpu``.

    Raises a ``ValueError`` naming the option when CUDA is asked for and absent."""
    if device == "torch-cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device}: CUDA is not available to torch {torch.__version__}"
                " (no GPU, or a CPU-only torch build); use device = cpu, or torch-cpu for the"
                " device path on the CPU"
            )
        return torch.device(device)
    raise ValueError(f"device {device!r}: expected cpu, torch-cpu, cuda or cuda:N")


def check_options(options: dict) -> None:
    """Raises a ``ValueError`` naming the option when the device backend cannot train a run of
    ``[embed.train]`` ``options`` (before anything is written): an unsupported model, a bf16
    table, CUDA asked for and absent."""
    resolve(options["device"])
    step.check_model(options["model"])
    if options.get("table_dtype") == "bf16":
        raise ValueError("table_dtype = bf16 is not supported with a torch device; use table_dtype = f32")


class TorchCompute:
    """Trains pieces on a torch device; counts the work of the steps and the copies."""

    def __init__(self, device: str):
        self.device = resolve(device)
        self.cuda = self.device.type == "cuda"
        # Copies host <-> device run on their own stream, so that the next piece's rows can
        # move while the compute stream works.
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.bytes_h2d = 0
        self.bytes_d2h = 0

    def _table(self, params, state, width: int) -> step.Table:
        """A host slot of rows of ``width`` floats as device tensors (the host memory itself
        on the CPU twin)."""
        p = torch.frombuffer(params, dtype=torch.float32).view(-1, width)
        s = torch.frombuffer(state, dtype=torch.float32).view(p.shape[0], -1)
        if not self.cuda:
            return step.Table(p, s)
        with torch.cuda.stream(self.copy_stream):
            dp, ds = p.to(self.device, non_blocking=True), s.to(self.device, non_blocking=True)
        self.bytes_h2d += p.numel() * 4 + s.numel() * 4
        return step.Table(dp, ds)

    def _ctx(self, c: dict, tables: dict) -> step.Ctx:
        def table(params, state, width):
            key = id(params)
            if key not in tables:
                tables[key] = (self._table(params, state, width), params, state)
            return tables[key][0]

        step.check_model(c["model"])
        parts = [table(p, s, c["dim"]) for p, s, _ in c["parts"]]
        width = step.rel_dim(c["model"], c["dim"])
        rels = table(*c["rels"][:2], width) if c["rels"] is not None else None
        head_prob = c["head_prob"]
        return step.Ctx(
            model=c["model"],
            dim=c["dim"],
            transe_norm=c["transe_norm"],
            loss=c["loss"],
            margin=c["margin"],
            gamma=c["gamma"],
            adversarial=c["adversarial"],
            lr=c["lr"],
            parts=parts,
            sizes=[n for _, _, n in c["parts"]],
            src_part=c["src_part"],
            dst_part=c["dst_part"],
            rels=rels,
            inverse_offset=c["inverse_offset"],
            corrupt=c["corrupt"],
            head_prob=torch.tensor(head_prob, dtype=torch.float32, device=self.device) if head_prob else None,
            negatives=c["negatives"],
            degree_fraction=c["degree_fraction"],
            pool=c["pool"],
            part_of=c["part_of"],
            part_size=c["part_size"],
            num_nodes=c["num_nodes"],
            reg=c["reg"],
            reg_weight=c["reg_weight"],
        )

    def train_piece(self, ctxs: list[dict], groups: list[int], bounds: list[int], edges, weights, key: int):
        """Trains one piece: chunk ``c`` is edges ``bounds[c] .. bounds[c + 1]`` (rows of
        three int32) of ``edges``, with ``weights`` (f32, empty: unweighted), against
        ``ctxs[groups[c]]``, seeded ``derive(key, c)``. Returns ``(loss, directions, flops,
        busy seconds)``."""
        start = time.perf_counter()
        tables: dict = {}
        contexts = [self._ctx(c, tables) for c in ctxs]
        with warnings.catch_warnings():
            # The edges are lent read-only; torch warns that it cannot mark its view so.
            warnings.simplefilter("ignore", UserWarning)
            e = torch.frombuffer(edges, dtype=torch.int32).view(-1, 3)
            w = torch.frombuffer(weights, dtype=torch.float32) if len(weights) else None
        if self.cuda:
            with torch.cuda.stream(self.copy_stream):
                e = e.to(self.device, non_blocking=True)
                w = w.to(self.device, non_blocking=True) if w is not None else None
            self.bytes_h2d += e.numel() * 4 + (w.numel() * 4 if w is not None else 0)
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        e = e.to(torch.int64)
        loss, directions, flops = 0.0, 0, 0.0
        for c, g in enumerate(groups):
            lo, hi = bounds[c], bounds[c + 1]
            ctx = contexts[g]
            chunk_key = rng.as_u64(rng.derive(key, c))[0]
            chunk_loss, d, f = step.train_chunk(ctx, e[lo:hi], None if w is None else w[lo:hi], chunk_key)
            loss += chunk_loss
            directions += d
            flops += f
        if self.cuda:
            self._write_back(tables)
        return loss, directions, flops, time.perf_counter() - start

    def _write_back(self, tables: dict) -> None:
        """Copies every slot of the piece back into its host buffer before returning."""
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            for table, params, state in tables.values():
                hp = torch.frombuffer(params, dtype=torch.float32).view_as(table.params)
                hs = torch.frombuffer(state, dtype=torch.float32).view_as(table.state)
                hp.copy_(table.params, non_blocking=True)
                hs.copy_(table.state, non_blocking=True)
                self.bytes_d2h += hp.numel() * 4 + hs.numel() * 4
        self.copy_stream.synchronize()
