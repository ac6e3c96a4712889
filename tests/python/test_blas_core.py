"""Which OpenBLAS kernels the CPU backend's GEMMs run on (backend/cpu/blas_core.h).

OpenBLAS picks its kernels from the CPU's model number; on a CPU newer than the library it falls
back to SSE3 ("Prescott") kernels, several times slower, and mxtrain then restarts itself with
OPENBLAS_CORETYPE set. The reference for what the CPU can run is the kernel's own list of CPU
flags in /proc/cpuinfo, read here independently of mxtrain's CPUID check."""
import json
import platform

import pytest

from conftest import cpu_flags, require_binary, run_mxtrain, set_args

# OpenBLAS x86-64 kernel sets by the instructions they use (OpenBLAS's driver/others/dynamic.c).
SSE_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "opteron",
             "opteron(sse3)", "barcelona", "nano", "katmai", "coppermine", "northwood", "banias",
             "bobcat", "unknown"}
AVX_CORES = {"sandybridge", "bulldozer", "piledriver"}
AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def expected_core():
    """The kernel set this CPU calls for when OpenBLAS's own pick is SSE or AVX, or None."""
    flags = cpu_flags()
    if AVX512 <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None




@pytest.fixture(autouse=True)
def _x86_only_clean_env(monkeypatch):
    """x86-64 only; mxtrain starts without OPENBLAS_CORETYPE (conftest sets it for PyTorch) or
    the test hook, unless a test sets them."""
    require_binary()
    if platform.machine() != "x86_64":
        pytest.skip("OpenBLAS core selection is x86-64 only")
    for k in ("OPENBLAS_CORETYPE", "MXTRAIN_BLAS_REPLACED", "MXTRAIN_TEST_BLAS_PICKED"):
        monkeypatch.delenv(k, raising=False)


def run_clean(extra):
    """`mxtrain bench sgemm`'s JSON, with the variables in `extra` set."""
    r = run_mxtrain(["bench", "sgemm", "--size", "64", "--seconds", "0"], env=extra)
    assert r.rc == 0, r
    return json.loads(r.stdout)


def test_the_kernels_in_use_fit_the_cpu():
    """Without OPENBLAS_CORETYPE, whatever OpenBLAS picks by itself: never SSE or AVX kernels on
    a CPU with AVX2 (this fails on a CPU OpenBLAS does not know, without the restart)."""
    out = run_clean({})
    assert out["blas"].startswith("OpenBLAS "), out
    want = expected_core()
    if want is None:
        pytest.skip("this CPU has no AVX2: OpenBLAS's pick stands")
    assert out["blas_core"].lower() not in SSE_CORES | AVX_CORES, out
    if out["blas_core_replaced"]:
        assert out["blas_core"] == want, out
        assert out["blas_core_replaced"].lower() in SSE_CORES | AVX_CORES, out


@pytest.mark.parametrize("picked", ["Prescott", "Nehalem", "Sandybridge"])
def test_a_fallback_pick_is_replaced_by_the_cpus_class(picked):
    want = expected_core()
    if want is None:
        pytest.skip("this CPU has no AVX2")
    out = run_clean({"MXTRAIN_TEST_BLAS_PICKED": picked})
    assert out["blas_core"] == want, out
    assert out["blas_core_replaced"] == picked, out


@pytest.mark.parametrize("picked", ["Haswell", "Zen", "SkylakeX", "SomeFutureCore"])
def test_a_modern_pick_stands(picked):
    # The hook only changes what mxtrain believes OpenBLAS picked; nothing is replaced, so the
    # kernels are OpenBLAS's own and no replacement is reported.
    out = run_clean({"MXTRAIN_TEST_BLAS_PICKED": picked})
    assert out["blas_core_replaced"] == "", out


def test_the_users_coretype_is_kept():
    out = run_clean({"OPENBLAS_CORETYPE": "Prescott", "MXTRAIN_TEST_BLAS_PICKED": "Prescott"})
    assert out["blas_core"] == "Prescott", out
    assert out["blas_core_replaced"] == "", out


def test_the_startup_line_names_the_kernels(tmp_path):
    want = expected_core()
    if want is None:
        pytest.skip("this CPU has no AVX2")
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefgh " * 400)
    r = run_mxtrain(["train"] + set_args({
        "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
        "model.num_attention_heads": 2, "model.num_key_value_heads": 1,
        "model.vocab_size": 256, "train.steps": 1, "train.micro_batch": 1,
        "train.seq_len": 16, "data.path": corpus, "data.val_fraction": 0.0,
        "run.out_dir": tmp_path / "o", "run.sample_tokens": 0}),
                    env={"MXTRAIN_TEST_BLAS_PICKED": "Prescott"})
    assert r.rc == 0, r
    assert ("device cpu (OpenBLAS " in r.stderr + r.stdout), r
    assert (f"{want} kernels set by mxtrain: OpenBLAS had picked Prescott for this CPU"
            in r.stderr + r.stdout), r
