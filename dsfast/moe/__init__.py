"""deepspeed.moe for programs that import it without using MoE: the parameter-group helpers work on dense
models; MoE layers and expert-parallel parameters are refused with a clear error (dsfast has no MoE)."""
