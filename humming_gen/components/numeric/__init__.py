"""numeric family: code extraction, conversion to the compute type, zero points and group scales."""
