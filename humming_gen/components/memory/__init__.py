"""memory family: global->shared loaders and shared->register fragment loads."""
