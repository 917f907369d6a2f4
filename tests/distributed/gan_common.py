"""A two-engine GAN in the shape of DeepSpeed's DCGAN example, and its plain-PyTorch reference.

Per step: netD.zero_grad(); backward(err_real); backward(err_fake) on D; D.step(); netG.zero_grad();
backward(err_g) on G, which also deposits gradients into D (cleared by the next netD.zero_grad()).
"""
import torch

GLOBAL = 8
ADAM = {"lr": 1e-2, "betas": (0.5, 0.999)}


def build_gan(seed=0):
    torch.manual_seed(seed)
    g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6))
    d = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
    return g, d


def gan_batch(step, n=GLOBAL):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(n, 6, generator=gen) + 1.0, torch.randn(n, 4, generator=gen)


def gan_config(micro):
    # gradient_clipping 0: the plain-PyTorch reference below does not clip (DeepSpeed's default is 1.0)
    return {"train_micro_batch_size_per_gpu": micro, "steps_per_print": 1000, "gradient_clipping": 0.0,
            "optimizer": {"type": "Adam", "params": {"lr": ADAM["lr"], "betas": list(ADAM["betas"])}}}


def gan_loop(net_g, net_d, steps, run_g, run_d, back_g, back_d, step_g, step_d, part=slice(None)):
    """The loop itself, over callables so that the engines and plain torch share it. Returns the losses."""
    bce = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in range(steps):
        real, noise = (t[part] for t in gan_batch(step))
        net_d.zero_grad()
        err_real = bce(run_d(real), torch.ones(len(real), 1))
        back_d(err_real)
        fake = run_g(noise)
        err_fake = bce(run_d(fake.detach()), torch.zeros(len(real), 1))
        back_d(err_fake)
        step_d()
        net_g.zero_grad()
        err_g = bce(run_d(fake), torch.ones(len(real), 1))
        back_g(err_g)
        step_g()
        losses.append((float((err_real + err_fake).detach()), float(err_g.detach())))
    return losses


def torch_gan(steps):
    """Plain PyTorch on the global batch: (losses, G params, D params)."""
    net_g, net_d = build_gan()
    opt_g = torch.optim.Adam(net_g.parameters(), **ADAM)
    opt_d = torch.optim.Adam(net_d.parameters(), **ADAM)
    losses = gan_loop(net_g, net_d, steps, net_g, net_d, torch.Tensor.backward, torch.Tensor.backward,
                      opt_g.step, opt_d.step)
    return losses, [p.detach().clone() for p in net_g.parameters()], [p.detach().clone() for p in net_d.parameters()]


def engine_gan(initialize, steps, part=slice(None), micro=GLOBAL, **init_kw):
    """The same loop through two engines: (losses, G params, D params)."""
    net_g, net_d = build_gan()
    eng_g = initialize(model=net_g, model_parameters=net_g.parameters(), config=gan_config(micro), **init_kw)[0]
    eng_d = initialize(model=net_d, model_parameters=net_d.parameters(), config=gan_config(micro), **init_kw)[0]
    losses = gan_loop(net_g, net_d, steps, eng_g, eng_d, eng_g.backward, eng_d.backward, eng_g.step, eng_d.step,
                      part)
    return losses, [p.detach().clone() for p in net_g.parameters()], [p.detach().clone() for p in net_d.parameters()]
