"""The gradients of every stage: one intake, bucket layouts, the one reducer and its transports."""
