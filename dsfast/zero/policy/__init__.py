"""Pure data every owner is built from: partition maths, placement, precision."""
