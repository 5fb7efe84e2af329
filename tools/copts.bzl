"""Compiler options shared by the libraries' BUILD files.

CPU_KERNEL_COPTS: for the CPU backends of the ops (Eigen GEMMs, loops over activations), which
are the slow path of every CPU run and test: optimized even in fastbuild, and built for x86-64
with AVX2 and FMA (every x86-64 server since 2013-2015; Eigen's GEMM kernels are about twice as
fast with them).
"""

CPU_KERNEL_COPTS = select({
    "@platforms//cpu:x86_64": ["-O2", "-mavx2", "-mfma"],
    "//conditions:default": ["-O2"],
})
