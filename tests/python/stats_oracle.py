#!/usr/bin/env python3
"""NumPy's figures for `safetensors stats`: per tensor of a file, min, max, mean and population
standard deviation of the finite values, and counts of NaN, +Inf, -Inf and zeros.

    stats_oracle.py MODEL_DIR OUT_DIR

Reads MODEL_DIR/model.safetensors (the all-MiniLM-L6-v2 file the `minilm` fixture fetches) and
writes OUT_DIR/stats.tsv: NAME MIN MAX MEAN STD NAN POS_INF NEG_INF ZEROS, floats as repr().
Exit code 77 (skipped) when the model or numpy is missing, unless SAFETENSORS_REQUIRE_PYTHON=1
and the model is there.
"""
import os
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(1 if os.environ.get("SAFETENSORS_REQUIRE_PYTHON") == "1" else 77)


def main():
    model = os.path.join(sys.argv[1], "model.safetensors")
    if not os.path.exists(model):
        print(f"skipped: {model} is missing (the minilm fixture needs network access)")
        sys.exit(77)
    os.makedirs(sys.argv[2], exist_ok=True)
    lines = []
    for name, arr in sorted(load_file(model).items()):
        x = arr.astype(np.float64).ravel()
        fin = x[np.isfinite(x)]
        figures = [fin.min(), fin.max(), fin.mean(), fin.std()] if fin.size else [float("nan")] * 4
        counts = [np.isnan(x).sum(), (x == np.inf).sum(), (x == -np.inf).sum(), (fin == 0).sum()]
        lines.append("\t".join([name] + [repr(float(v)) for v in figures] + [str(int(c)) for c in counts]))
    with open(os.path.join(sys.argv[2], "stats.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"stats of {len(lines)} tensors of {model}")


if __name__ == "__main__":
    main()
