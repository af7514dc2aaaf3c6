"""schedule family: tile mapping (dense, split-K; MoE schedules join here)."""
