"""Memory estimates and the offload plan from the machine's figures (they count owners' layouts)."""
