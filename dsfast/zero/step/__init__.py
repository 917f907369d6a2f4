"""The optimizer step of every stage: the decision (overflow, norm, clip) and its application to the units."""
