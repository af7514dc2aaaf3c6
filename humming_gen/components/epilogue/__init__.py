"""epilogue family: accumulators -> output."""
