"""Build macros for CUDA sources: nvcc compiles .cu files, cc_library links the objects.

The target architectures come from the build setting //tools:cuda_archs, a comma-separated
list of `sm_XY[a]` (machine code) and `compute_XY[a]` (embedded PTX) entries:

    bazel build --//tools:cuda_archs=sm_90a //...

//tools:cuda_lineinfo (default off) adds -lineinfo, the source lines that compute-sanitizer
and ncu report: tools/stage_gpu.sh turns it on for the GPU machine's binaries. Left off, a
clean build does about 5% less device compilation.

Without a CUDA toolkit (see third_party/repositories.bzl) `cuda_library` becomes a plain
cc_library of its headers and host sources guarded by LOSSRT_WITH_CUDA.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC_PATH")

def _gencode_flags(archs):
    flags = []
    for arch in [a.strip() for a in archs.split(",") if a.strip()]:
        if arch.startswith("sm_"):
            flags.append("-gencode=arch=compute_%s,code=%s" % (arch[3:], arch))
        elif arch.startswith("compute_"):
            flags.append("-gencode=arch=%s,code=%s" % (arch, arch))
        else:
            fail("cuda_archs entry %r is neither sm_XY nor compute_XY" % arch)
    return flags

def _cuda_objects_impl(ctx):
    archs = ctx.attr._archs[BuildSettingInfo].value
    headers = depset(ctx.files.hdrs)
    outputs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, src.basename[:-len(src.extension) - 1]))
        args = [
            "-c",
            src.path,
            "-o",
            out.path,
            "-std=c++17",
            "-O3",
            "--expt-relaxed-constexpr",
            # One thread an architecture (as many as there are cores): the two
            # device compilations of a file run side by side, so the longest
            # files do not end a build on one core of an otherwise idle machine.
            "--threads=0",
            "-Xcompiler",
            "-fPIC",
            "-I.",
            "-I" + ctx.bin_dir.path,
        ] + (["-lineinfo"] if ctx.attr._lineinfo[BuildSettingInfo].value else []) + \
            _gencode_flags(archs) + ctx.attr.copts
        # nvcc names its temporary files after its pid and the source. Sandboxed actions run in
        # their own pid namespaces (nvcc is often pid 2) and share /tmp, so two builds of the same
        # file at once (two checkouts on one machine) clobbered each other's temporaries: each
        # compile gets a private TMPDIR.
        ctx.actions.run_shell(
            command = ('tmp=$(mktemp -d "${TMPDIR:-/tmp}/nvcc.XXXXXXXX") && ' +
                       'TMPDIR="$tmp" "%s" "$@"; status=$?; rm -rf "$tmp"; exit $status') % NVCC_PATH,
            arguments = args,
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            use_default_shell_env = True,
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
        )
        outputs.append(out)
    return [DefaultInfo(files = depset(outputs))]

BuildSettingInfo = provider(fields = ["value"])

def _archs_value_impl(ctx):
    return [BuildSettingInfo(value = ctx.build_setting_value)]

cuda_archs_setting = rule(
    implementation = _archs_value_impl,
    build_setting = config.string(flag = True),
)

cuda_lineinfo_setting = rule(
    implementation = _archs_value_impl,
    build_setting = config.bool(flag = True),
)

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "copts": attr.string_list(),
        "_archs": attr.label(default = "//tools:cuda_archs"),
        "_lineinfo": attr.label(default = "//tools:cuda_lineinfo"),
    },
)

def cuda_library(name, cu_srcs = [], srcs = [], hdrs = [], cu_hdrs = [], deps = [], copts = [], cu_copts = [], **kwargs):
    """A cc_library whose .cu files (cu_srcs) are compiled by nvcc when CUDA is present.

    Args:
      name: the library.
      cu_srcs: .cu files, compiled by nvcc; left out without a toolkit.
      srcs: host sources for the C++ compiler (guard CUDA calls with LOSSRT_WITH_CUDA).
      hdrs: public headers.
      cu_hdrs: headers the .cu files include (nvcc sees only these and the toolkit's).
      deps: cc deps of the library.
      copts: host compiler options.
      cu_copts: extra nvcc options.
      **kwargs: passed to cc_library (visibility, testonly, ...).
    """
    objs = []
    cuda_deps = []
    if CUDA_ENABLED and cu_srcs:
        _cuda_objects(
            name = name + "_cu_objs",
            srcs = cu_srcs,
            hdrs = cu_hdrs + [h for h in hdrs if h not in cu_hdrs],
            copts = cu_copts,
            testonly = kwargs.get("testonly", False),
        )
        objs = [":" + name + "_cu_objs"]
    if CUDA_ENABLED:
        cuda_deps = ["@local_cuda//:cudart"]
    native.cc_library(
        name = name,
        srcs = srcs + objs,
        hdrs = hdrs,
        deps = deps + cuda_deps,
        copts = copts,
        **kwargs
    )

def if_cuda(if_true, if_false = []):
    """Picks if_true where the CUDA toolkit was found, if_false elsewhere."""
    return if_true if CUDA_ENABLED else if_false
