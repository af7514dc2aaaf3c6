"""pipeline family: kernel skeletons."""
