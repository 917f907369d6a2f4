"""Shard units (one bucket's slice, master, states, gradient, residency) and the flat storage of stages 1-2."""
