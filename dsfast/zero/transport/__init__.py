"""How ZeRO's buffers cross ranks: the transports (one rank, c10d, the same-host /dev/shm table), each allocating,
reducing and all-gathering, and that table. Below the gradient, unit and parameter folders, which all use them."""
