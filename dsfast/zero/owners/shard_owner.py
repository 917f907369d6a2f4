"""What the ZeRO owners of stages 1-3 share (ShardOwner): the optimizer steps this rank's shard units, held by a
unit store (flat_shards.FlatShards, stage3.Stage3Store), whose NVMe swaps are the owner's."""
from ..owner import OwnerDefaults


def hyperparameters(groups):
    """Each param group without its params (one {} for a plain list)."""
    if groups and isinstance(groups[0], dict):
        return [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return [{}]


class ShardOwner(OwnerDefaults):
    """Needs `store` (a shard_unit.UnitStore) and `stage`."""

    @property
    def units(self):
        """The store's shard units (shard_unit.ShardUnit), in the optimizer's order."""
        return self.store.units

    @property
    def swap(self):
        """The NVMe placement of the units' states (nvme_states.NvmeStates), or None."""
        return self.store.swap

    @property
    def param_swap(self):
        """Stage 3's parameter shards on NVMe (nvme_params.NvmeParams), or None."""
        return self.store.param_swap

    @property
    def trains(self):
        return bool(self.store.params)

    @property
    def optimizer_device(self):
        return self.store.master_device

    def optimizer_groups(self, groups):
        """One group per user group over this rank's shard units, its hyperparameters kept; every group is kept,
        empty or not, so the user's group indices (and per-group schedules) still line up."""
        out = [dict(h, params=[]) for h in hyperparameters(groups)]
        for u in self.store.units:
            out[u.plan.group]["params"].append(u.shard)
        return out

    def adopt_client_optimizer(self, optimizer, groups):
        """A client optimizer built on the model's params steps the flat shards instead (a fresh one only)."""
        if len(optimizer.state):
            raise ValueError(f"the client optimizer ({type(optimizer).__name__}) already has state; under ZeRO "
                             f"stage {self.stage} it steps flat partitions, so pass an optimizer that has not "
                             "stepped yet")
        for g, s in zip(optimizer.param_groups, self.optimizer_groups(groups)):
            g["params"] = s["params"]
