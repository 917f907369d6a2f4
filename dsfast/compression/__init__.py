"""deepspeed.compression: only the helpers programs import from it (compression training itself is not supported;
a config enabling it is an error)."""
