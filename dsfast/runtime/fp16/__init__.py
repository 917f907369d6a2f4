"""deepspeed.runtime.fp16: the loss scalers under DeepSpeed's names (loss_scaler.py) and its stage 0 optimizer
wrappers' classes for isinstance checks (fused_optimizer.py, unfused_optimizer.py)."""
