"""Adam over parameter groups of one tensor each, as 3DGS trains its Gaussians.

On CUDA a single extension call updates every group (one fused kernel launch for all of them, no per-group
Python arithmetic on the device); on the CPU the same arithmetic runs in torch. Each parameter's state is
{step, exp_avg, exp_avg_sq}, whose rows densification edits together with the parameter's
(strategy.edit_rows)."""
from __future__ import annotations

import math

import torch

from .kernels import extension, handles


class Adam(torch.optim.Optimizer):
    def __init__(self, groups: list[dict], betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-15):
        super().__init__(groups, {"lr": 1e-3})
        self.betas, self.eps = betas, eps

    @torch.no_grad()
    def step(self, closure=None):
        beta1, beta2 = self.betas
        params, grads, exp_avgs, exp_avg_sqs, step_sizes, inv_sqrt_bias2s = [], [], [], [], [], []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                step_sizes.append(group["lr"] / (1 - beta1 ** state["step"]))
                inv_sqrt_bias2s.append(1 / math.sqrt(1 - beta2 ** state["step"]))
        if params and handles(params[0]):
            extension().adam_step(params, grads, exp_avgs, exp_avg_sqs, step_sizes, inv_sqrt_bias2s, beta1, beta2,
                                  self.eps)
            return
        for p, g, m, v, step_size, inv_sqrt_bias2 in zip(params, grads, exp_avgs, exp_avg_sqs, step_sizes,
                                                         inv_sqrt_bias2s):
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(m, v.sqrt().mul_(inv_sqrt_bias2).add_(self.eps), value=-step_size)
