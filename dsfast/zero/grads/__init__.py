"""The gradients of every stage: one intake, bucket layouts and the one reducer (its transports: zero/transport/)."""
