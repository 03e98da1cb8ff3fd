"""cuda_library: .cu sources compiled by nvcc, wrapped in a cc_library.

    load("//third_party:cuda.bzl", "cuda_library")
    cuda_library(
        name = "kernels",
        srcs = ["attn_fwd.cu"],          # compiled by nvcc, one object each
        hdrs = ["kernels.h"],            # headers of this library (also seen by nvcc)
        cu_hdrs = ["mask.cuh"],          # private headers only the .cu files include
        deps = ["//api:core"],           # cc_library deps: their headers, includes and defines
    )

nvcc flags: -O3 -std=c++17, -Xcompiler -fPIC, -fvisibility=hidden (as .bazelrc gives C: only
CTXPAR_API is exported from a shared library) and the host warning flags, -Werror all-warnings,
one SASS per architecture in --define=ctxpar_cuda_archs=80,90 (the default) plus PTX of the
newest one so that newer GPUs can JIT it. When @local_cuda has no nvcc (CUDA_FOUND = False)
the target is an empty cc_library, so dependants still build; check CUDA_FOUND in BUILD files to
leave out sources that need CUDA headers.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

_DEFAULT_ARCHS = "80,90"

def _cuda_objects_impl(ctx):
    cc = [d[CcInfo].compilation_context for d in ctx.attr.deps if CcInfo in d]
    headers = depset(ctx.files.hdrs + ctx.files.cu_hdrs, transitive = [c.headers for c in cc])
    args_inc = []
    for c in cc:
        # nvcc has no -iquote: quote directories become ordinary -I directories.
        for d in c.quote_includes.to_list():
            args_inc += ["-I", d]
        for d in c.includes.to_list():
            args_inc += ["-I", d]
        for d in c.system_includes.to_list():
            args_inc += ["-isystem", d]
        for d in c.defines.to_list():
            args_inc.append("-D" + d)
    args_inc += ["-I", ".", "-I", ctx.bin_dir.path]

    archs = ctx.var.get("ctxpar_cuda_archs", _DEFAULT_ARCHS).split(",")
    gencode = []
    for a in archs:
        gencode += ["-gencode", "arch=compute_{a},code=sm_{a}".format(a = a)]
    gencode += ["-gencode", "arch=compute_{a},code=compute_{a}".format(a = archs[-1])]

    objs = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(".cu")]
        obj = ctx.actions.declare_file("%s_objs/%s.pic.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add_all([
            "-c",
            src.path,
            "-o",
            obj.path,
            "-O3",
            "-std=c++17",
            "-Xcompiler",
            "-fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror",
            "-Werror",
            "all-warnings",
        ])
        args.add_all(gencode)
        args.add_all(args_inc)
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "cu_hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs = [], hdrs = [], cu_hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library holding the nvcc objects of srcs, linked with cudart."""
    if not CUDA_FOUND:
        native.cc_library(name = name, **kwargs)
        return
    _cuda_objects(
        name = name + "_cu_objs",
        srcs = srcs,
        hdrs = hdrs,
        cu_hdrs = cu_hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cu_objs"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )
