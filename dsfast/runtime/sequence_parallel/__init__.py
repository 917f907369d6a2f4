"""deepspeed.runtime.sequence_parallel: Ulysses sequence parallelism's names (ulysses_sp.py), refused when used."""
