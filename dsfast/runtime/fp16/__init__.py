"""deepspeed.runtime.fp16: the loss scalers under DeepSpeed's names (loss_scaler.py)."""
