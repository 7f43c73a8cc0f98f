"""Pure state-machine logic: which state comes next, given a context. No I/O."""
