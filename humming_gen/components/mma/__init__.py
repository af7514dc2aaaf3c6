"""mma family: tensor-core back ends."""
