"""Finds the CUDA toolkit (nvcc, cudart, cuDNN, NCCL) for @local_cuda.

Writes @local_cuda//:defs.bzl with
    CUDA_FOUND   nvcc, cuda_runtime_api.h and libcudart were found
    CUDNN_FOUND  cudnn.h and libcudnn were found (implies CUDA_FOUND)
    NCCL_FOUND   nccl.h and libnccl were found (implies CUDA_FOUND)
    NVCC, CUDA_ROOT, CUDA_VERSION
and a BUILD file with cc_library targets cudart, cudnn, nccl (empty when not found), so that
CUDA code can be left out of the build cleanly on machines without the toolkit.

The root is $CUDA_HOME, else /usr/local/cuda. cuDNN and NCCL are looked for in the toolkit,
then in $CUDNN_HOME / $NCCL_HOME, then in the system directories (Debian/Ubuntu packages).

Stop-gap: api/BUILD does not (yet) declare api/ctxpar_cuda.h and api/ctxpar_nccl.h, so this
repository also offers them as :ctxpar_cuda_header and :ctxpar_nccl_header (symlinks to the
files in api/, so edits are seen). Once api/BUILD has targets for them, the BUILD files of
backends/cuda, comm/nccl and testing switch to those and these two targets go.
"""

_SYSTEM_INCLUDE = ["/usr/include", "/usr/include/x86_64-linux-gnu"]
_SYSTEM_LIB = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]

def _first_dir_with(ctx, dirs, name):
    for d in dirs:
        if d and ctx.path(d + "/" + name).exists:
            return d
    return None

def _find_pair(ctx, roots, header, libname):
    """Returns (include_dir, lib_dir) holding header and lib<libname>.so, or (None, None)."""
    inc_dirs = [r + "/include" for r in roots if r] + _SYSTEM_INCLUDE
    lib_dirs = []
    for r in roots:
        if r:
            lib_dirs += [r + "/lib64", r + "/lib"]
    lib_dirs += _SYSTEM_LIB
    inc = _first_dir_with(ctx, inc_dirs, header)
    lib = _first_dir_with(ctx, lib_dirs, "lib%s.so" % libname)
    if not inc or not lib:
        return (None, None)
    return (inc, lib)

def _cuda_version(ctx, nvcc):
    res = ctx.execute([nvcc, "--version"])
    if res.return_code != 0:
        return ""
    for line in res.stdout.splitlines():
        if "release" in line:
            # "Cuda compilation tools, release 13.0, V13.0.88"
            return line.split("release")[1].split(",")[0].strip()
    return ""

def _lib_target(name, inc, lib, libs, deps):
    """A cc_library naming headers under the symlinked include dir and linking libs."""
    return """
cc_library(
    name = "{name}",
    hdrs = glob(["{inc}/**/*.h", "{inc}/**/*.hpp"], allow_empty = True),
    includes = ["{inc}"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}"] + {libs},
    deps = {deps},
)
""".format(name = name, inc = inc, lib = lib, libs = repr(libs), deps = repr(deps))

def _api_headers(ctx, cuda, nccl):
    """The constructor headers in api/ as targets of this repository (see the module docstring)."""
    api = str(ctx.path(Label("//:WORKSPACE")).dirname) + "/api/"
    out = []
    for name, dep, wanted in [("cuda", ":cudart", cuda), ("nccl", ":nccl", nccl)]:
        if not wanted:
            out.append('cc_library(name = "ctxpar_%s_header")' % name)
            continue
        ctx.symlink(api + "ctxpar_%s.h" % name, "ctxpar_api/ctxpar_%s.h" % name)
        out.append("""
cc_library(
    name = "ctxpar_{n}_header",
    hdrs = ["ctxpar_api/ctxpar_{n}.h"],
    includes = ["ctxpar_api"],
    deps = ["{dep}"],
)
""".format(n = name, dep = dep))
    return out

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    cuda_inc, cuda_lib = _find_pair(ctx, [root], "cuda_runtime_api.h", "cudart")
    found = nvcc.exists and cuda_inc != None
    version = _cuda_version(ctx, nvcc) if found else ""

    extra_roots = [root, ctx.os.environ.get("CUDNN_HOME", "")]
    cudnn_inc, cudnn_lib = (None, None)
    if found:
        cudnn_inc, cudnn_lib = _find_pair(ctx, extra_roots, "cudnn.h", "cudnn")
    extra_roots = [root, ctx.os.environ.get("NCCL_HOME", "")]
    nccl_inc, nccl_lib = (None, None)
    if found:
        nccl_inc, nccl_lib = _find_pair(ctx, extra_roots, "nccl.h", "nccl")

    build = ['package(default_visibility = ["//visibility:public"])']
    if found:
        # Headers must live inside the repository for Bazel: symlink the include directories.
        ctx.symlink(cuda_inc, "cuda_include")
        libs = ["-lcudart", "-ldl", "-lrt", "-pthread"]
        build.append(_lib_target("cudart", "cuda_include", cuda_lib, libs, []))
    else:
        build.append('cc_library(name = "cudart")')
    if cudnn_inc:
        if cudnn_inc != cuda_inc:
            ctx.symlink(cudnn_inc, "cudnn_include")
        inc = "cudnn_include" if cudnn_inc != cuda_inc else "cuda_include"
        build.append(_lib_target("cudnn", inc, cudnn_lib, ["-lcudnn"], [":cudart"]))
    else:
        build.append('cc_library(name = "cudnn")')
    if nccl_inc:
        if nccl_inc != cuda_inc:
            ctx.symlink(nccl_inc, "nccl_include")
        inc = "nccl_include" if nccl_inc != cuda_inc else "cuda_include"
        build.append(_lib_target("nccl", inc, nccl_lib, ["-lnccl"], [":cudart"]))
    else:
        build.append('cc_library(name = "nccl")')
    build += _api_headers(ctx, found, nccl_inc != None)
    ctx.file("BUILD", "\n".join(build) + "\n")

    ctx.file("defs.bzl", "\n".join([
        '"""Generated by //third_party:cuda_configure.bzl."""',
        "CUDA_FOUND = %s" % found,
        "CUDNN_FOUND = %s" % (cudnn_inc != None),
        "NCCL_FOUND = %s" % (nccl_inc != None),
        'NVCC = "%s"' % (str(nvcc) if found else ""),
        'CUDA_ROOT = "%s"' % (root if found else ""),
        'CUDA_VERSION = "%s"' % version,
        "",
    ]))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "CUDNN_HOME", "NCCL_HOME"],
    local = True,
)
