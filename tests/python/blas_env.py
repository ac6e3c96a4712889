"""Gives this Python process, and the programs it starts, the OpenBLAS kernels mxtrain runs on.

numpy and torch (Debian's) load the same OpenBLAS as mxtrain, and OpenBLAS reads
OPENBLAS_CORETYPE once, when it loads. On a CPU OpenBLAS does not know it falls back to SSE3
kernels; mxtrain then restarts itself with better ones (backend/cpu/blas_core.h), and the
PyTorch reference should run on the same. So: call this before numpy or torch is imported."""
import json
import os
import subprocess
import sys


def match_mxtrain_blas(binary):
    """Sets OPENBLAS_CORETYPE (unless set already) to the kernels `binary` reports; returns
    `mxtrain bench sgemm`'s JSON (blas, blas_core, blas_core_replaced), or None if the binary
    cannot say (missing, or not built yet)."""
    try:
        p = subprocess.run([binary, "bench", "sgemm", "--size", "16", "--seconds", "0"],
                           capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    if p.returncode != 0:
        return None
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if "blas_core" not in out or "OPENBLAS_CORETYPE" in os.environ:
        return out
    loaded = [m for m in ("numpy", "torch") if m in sys.modules]
    if loaded:
        raise RuntimeError(f"match_mxtrain_blas called after {loaded} loaded OpenBLAS")
    os.environ["OPENBLAS_CORETYPE"] = out["blas_core"]
    if out["blas_core_replaced"]:
        os.environ["MXTRAIN_BLAS_REPLACED"] = out["blas_core_replaced"]
    return out
