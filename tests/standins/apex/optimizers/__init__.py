"""``apex.optimizers.FusedAdam``'s interface on ``torch.optim.Adam`` (see tests/standins/README.md).

The interface follows apex/optimizers/fused_adam.py: the constructor's keywords, ``zero_grad(self)``
without ``set_to_none`` (it sets gradients to None when ``set_grad_none``, the default), and in
``capturable`` mode a learning-rate tensor on the parameters' device, ``_step_supports_amp_scaling``
and a ``step(grad_scaler=...)`` that reads the scaler's inf check and scale as tensors, so that
``GradScaler.step`` hands them over instead of reading the inf check on the host.
"""
import torch


class FusedAdam(torch.optim.Adam):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0., amsgrad=False, set_grad_none=True,
                 capturable=False, use_master=False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if not bias_correction or use_master or (adam_w_mode and weight_decay):
            raise NotImplementedError("the stand-in models bias-corrected Adam (no AdamW decay, no master weights)")
        params = list(params)
        if capturable:
            device = params[0].device if torch.is_tensor(params[0]) else params[0]["params"][0].device
            lr = torch.tensor(lr, dtype=torch.float32, device=device)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        # apex hands the inf check to the optimiser only in capturable mode (torch's fused Adam always does).
        self._step_supports_amp_scaling = capturable

    def zero_grad(self):
        if self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
        else:
            super().zero_grad(set_to_none=False)

    def step(self, closure=None, grad_scaler=None):
        if self.capturable and grad_scaler is not None:
            device = self.param_groups[0]["params"][0].device
            self.found_inf = grad_scaler._check_inf_per_device(self)[device]
            self.grad_scale = grad_scaler._get_scale_async()
            try:
                return super().step(closure)
            finally:
                del self.found_inf, self.grad_scale
        return super().step(closure)
