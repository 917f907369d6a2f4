"""A tiny MoE model whose ranks run different experts (the routing is data: each sample names its expert), its
data and config, shared by worker_zero3_leaf.py and its one-process torch reference (test_zero3_leaf_dp.py).

Rank 0's samples go to experts 0 and 1, rank 1's to experts 1 and 2; expert 3 gets none anywhere. Under ZeRO stage
3 hooks on each expert, rank 0 would gather expert 0 while rank 1 gathers expert 2: the MoE block must be a leaf.
"""
import torch

D_IN, D_HID, EXPERTS, MICRO, LR = 8, 16, 4, 4, 1e-2
ROUTES = {0: (0, 1), 1: (1, 2)}   # rank -> the experts its samples use


class Expert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D_HID, D_HID)

    def forward(self, h):
        return torch.tanh(self.fc(h))


class SparseMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(D_HID, EXPERTS)
        self.experts = torch.nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, h, route):
        weights = torch.softmax(self.gate(h), dim=-1)
        out = torch.zeros_like(h)
        for e in sorted(set(route.tolist())):        # only the experts this batch's samples name
            idx = (route == e).nonzero().flatten()
            out = out.index_add(0, idx, self.experts[e](h[idx]) * weights[idx, e:e + 1])
        return h + out


class MoENet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(D_IN, D_HID)
        self.moe = SparseMoE()
        self.out = torch.nn.Linear(D_HID, 1)

    def forward(self, x, route):
        return self.out(self.moe(torch.tanh(self.inp(x)), route))


def batch(step, rank):
    """Rank `rank`'s micro-batch of step `step`: (x, route, y)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(MICRO, D_IN, generator=g), torch.randn(MICRO, 1, generator=g)
    route = torch.tensor([ROUTES[rank][i % 2] for i in range(MICRO)])
    return x, route, y


def config(leaf_module=None):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if leaf_module is not None:
        zero["leaf_module"] = leaf_module
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "optimizer": {"type": "Adam", "params": {"lr": LR}}, "steps_per_print": 1000,
            "zero_optimization": zero}


def torch_reference(steps, world):
    """One process, the whole global batch (every rank's samples), torch's Adam: parameters after each step."""
    model = MoENet()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    out = []
    for step in range(steps):
        parts = [batch(step, r) for r in range(world)]
        x, route, y = (torch.cat(t) for t in zip(*parts))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, route), y).backward()
        opt.step()
        out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out
