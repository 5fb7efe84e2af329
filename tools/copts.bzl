"""Compiler options shared by the libraries' BUILD files.

CPU_KERNEL_COPTS: for the CPU backends of the ops (Eigen GEMMs, loops over activations), which
are the slow path of every CPU run and test: optimized even in fastbuild. (The instruction set,
AVX2 and FMA, is set for every translation unit in .bazelrc: Eigen must see one ISA in a
binary.)
"""

CPU_KERNEL_COPTS = ["-O2"]
