"""Humming side of the bench scripts: the implementation lives in humming_gen/bench/humming.py. Run alone, it lists
the presets that have a Humming mapping."""

import argparse

from humming_gen.bench.humming import FORMATS, HummingUnavailable, humming_layers  # noqa: F401

if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()
    print("\n".join(FORMATS))
