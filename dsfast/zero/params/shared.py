"""ZeRO stage 3 on same-host CPU ranks: every rank's parameter shards published in one /dev/shm table.

The table holds every partitioned parameter whole and padded, back to back (rank r's shard of a parameter at
offset r * shard_numel of that parameter's region), so gathering a parameter is one memcpy out of the table: no
collective, no rendezvous. Ranks keep their own private shards (what the optimizer, checkpoints and
GatheredParameters write); the table is a snapshot taken at `publish`, a collective every rank calls at the same
point (after each optimizer step, after a checkpoint load, after GatheredParameters(modifier_rank=...)):
    rendezvous  every rank finished reading the old snapshot (its gathers come before its publish call)
    copy        each rank writes its own slots only
    rendezvous  every slot is written: gathers may read again
Between two publishes nothing writes the table, so gathers need no synchronisation at all and may differ from
rank to rank (an extra eval forward on one rank cannot deadlock).

Used when: more than one rank, gloo, every rank on this host, every parameter fp32 on the CPU, /dev/shm has room,
and DSFAST_SHM_ALLREDUCE is not "0" (shm_reduce.shm_allocator decides, for every rank alike).
"""
import torch
import torch.distributed as dist

from ...comm.group_rendezvous import rendezvous

def shareable(records, device):
    """Whether stage 3's parameters could live in shared tables (every rank must see the same answer: callers
    agree through the allocator's collective check)."""
    return bool(records) and torch.device(device).type == "cpu" and all(
        r.dtype == torch.float32 and r.device.type == "cpu" and r.shard.device.type == "cpu" for r in records)


class SharedParams:
    def __init__(self, records, allocate):
        """records: every partitioned parameter (same list, same order on every rank). allocate: a
        shm_reduce.SharedTable. `ok` is False (and nothing is used) when the table could not be made."""
        self.records = list(records)
        self.world = self.records[0].world
        self.rank = self.records[0].rank
        self.group = self.records[0].group
        total = sum(r.padded for r in self.records)
        row = allocate(total // self.world, torch.float32, torch.device("cpu"))   # padded: a multiple of world
        table = allocate.table
        self.ok = table is not None and row.data_ptr() == table[self.rank].data_ptr()
        self.epoch = 0   # publishes so far (the same count on every rank: a publish is a collective)
        if not self.ok:
            return
        self.flat = table.view(-1)
        offset = 0
        for r in self.records:
            r.shared, r.shared_offset = self, offset
            offset += r.padded

    def fill(self, rec, out):
        """rec's whole (padded) values from the last snapshot into `out`."""
        out.copy_(self.flat[rec.shared_offset:rec.shared_offset + rec.padded])

    @torch.no_grad()
    def publish(self, records=None):
        """A collective: every rank's current shards of `records` (all when None) into the table."""
        rendezvous(self.group, ("publish",))
        for r in (self.records if records is None else records):
            lo = r.shared_offset + self.rank * r.shard_numel
            self.flat[lo:lo + r.shard_numel].copy_(r.shard)
        rendezvous(self.group, ("publish",))
        self.epoch += 1

    def memory(self):
        """The part of the table this rank wrote (the rest is the other ranks')."""
        return [self.flat.view(self.world, -1)[self.rank]]
