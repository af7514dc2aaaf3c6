"""ptx family: inline-asm wrappers."""
