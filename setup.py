"""Build script for the rwkv package and its ahead-of-time compiled extension ``rwkv._C``.

Build knobs (environment variables), all read here and nowhere else (listed with their meaning in
rwkv/settings.py, BUILD_SETTINGS, and the README's build settings table):

  RWKV_BUILD_EXT=0          pure-Python install: no extension, every op uses its torch reference.
  RWKV_BUILD_CUDA=auto|0|1  compile csrc/cuda/*.cu into rwkv._C. ``auto`` (default) builds CUDA when
                            nvcc is found (CUDA_HOME or PATH) *and* the installed torch is a CUDA
                            build (torch.version.cuda); a CPU-only torch cannot link CUDA code.
                            ``1`` fails loudly when either is missing.
  TORCH_CUDA_ARCH_LIST      CUDA architectures; default "7.5;8.0;8.6;8.9;9.0+PTX".
  MAX_JOBS                  parallel compile jobs (ninja); torch's default otherwise.
  DEBUG=1                   -O0 -g instead of -O3.
  RWKV_SANITIZE=1           AddressSanitizer + UndefinedBehaviorSanitizer (-O1 -g), CPU only, and no
                            rwkv/_build_info.py written: for ``make sanitize``, which builds into
                            build-asan/ (never in place) and loads it only in its own test run.

Supported install: ``pip install --no-build-isolation -e .`` (or without -e), so the extension is
compiled against the torch you already have. There is no network access and no compiling at run time.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_EXT = os.environ.get("RWKV_BUILD_EXT", "1") != "0"
BUILD_CUDA = os.environ.get("RWKV_BUILD_CUDA", "auto").lower()
DEBUG = os.environ.get("DEBUG", "0") == "1"
SANITIZE = os.environ.get("RWKV_SANITIZE", "0") == "1"

if BUILD_CUDA not in ("auto", "0", "1"):
    sys.exit(f"setup.py: RWKV_BUILD_CUDA must be auto, 0 or 1, got {BUILD_CUDA!r}")


def _rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


# See _extensions(): symbols from static archives (a statically linked libstdc++) stay private.
PRIVATE_ARCHIVES = ["-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []


def _find_nvcc():
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


def _git_sha():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:
        return "unknown"


def _extensions():
    if not BUILD_EXT:
        print("setup.py: RWKV_BUILD_EXT=0 -> pure-Python install (reference ops only)")
        return [], {}, {"cuda": False, "ext": False}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    nvcc = _find_nvcc()
    torch_cuda = torch.version.cuda is not None
    if BUILD_CUDA == "1" and not (nvcc and torch_cuda):
        sys.exit("setup.py: RWKV_BUILD_CUDA=1 but "
                 + ("nvcc was not found (set CUDA_HOME)" if not nvcc else
                    f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch"))
    with_cuda = not SANITIZE and (BUILD_CUDA == "1" or (BUILD_CUDA == "auto" and bool(nvcc) and torch_cuda))

    # The CPU glue (torch headers) and the torch-free ISA kernels. Each isa_<name>.cpp selects its
    # instruction set itself (see csrc/README.md), so one set of flags serves every file.
    sources = ["csrc/module.cpp", "csrc/inference_only.cpp"]
    sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
    sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "cpu", "kernels", "*.cpp")))
    opt = ["-O0", "-g"] if DEBUG else ["-O3"]
    # Every check aborts the process (-fno-sanitize-recover): one report fails the test run.
    sanitize = (["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
                if SANITIZE else [])
    if SANITIZE:
        opt = ["-O1", "-g"] + sanitize
    cxx = opt + ["-std=c++17", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    link = []
    if sys.platform.startswith("linux") and torch.backends.openmp.is_available():
        # at::parallel_for is a header template: without -fopenmp it silently runs serially.
        # At run time the libgomp.so.1 torch already loaded is reused (same soname): one thread pool,
        # sized by torch.set_num_threads.
        cxx.append("-fopenmp")
        link.append("-fopenmp")
    if sys.platform.startswith("linux"):
        # Symbols the link takes from static archives stay private to rwkv._C. Some toolchains
        # link libstdc++ statically into shared objects (seen on the GPU machine's /opt/gcc g++):
        # its functions then bound to our copy but its data (locale facet ids, the classic locale)
        # to the process's shared libstdc++, and formatting a number in an error message called
        # the wrong facet and crashed the process. Hidden, the private copy is self-consistent.
        # Without static archives the flag changes nothing.
        link += PRIVATE_ARCHIVES
    link += sanitize
    ext_kwargs = dict(include_dirs=include_dirs, extra_compile_args={"cxx": cxx}, extra_link_args=link)
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "7.5;8.0;8.6;8.9;9.0+PTX")
        sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
        sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
        ext_kwargs["extra_compile_args"]["nvcc"] = opt + ["-std=c++17", "--use_fast_math",
                                                          "-Xptxas", "-O3"]
        ext_kwargs["libraries"] = ["cublas"]
        ext_kwargs["define_macros"] = [("RWKV_WITH_CUDA", "1")]
        ext = CUDAExtension("rwkv._C", sources, **ext_kwargs)
    else:
        ext = CppExtension("rwkv._C", sources, **ext_kwargs)

    exts = [ext]
    # The World tokenizer in C++: a plain CPython extension with no torch dependency.
    tok_sources = _rel(glob.glob(os.path.join(ROOT, "csrc", "tokenizer", "*.cpp")))
    if tok_sources:
        from setuptools import Extension
        exts.append(Extension("rwkv._tokenizer", tok_sources, include_dirs=include_dirs,
                              extra_compile_args=opt + ["-std=c++17", "-fvisibility=hidden"],
                              extra_link_args=PRIVATE_ARCHIVES + sanitize,
                              language="c++"))
    info = {"ext": True, "cuda": with_cuda, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST")}
    print(f"setup.py: building rwkv._C with CUDA={'yes' if with_cuda else 'no'} "
          f"(nvcc={nvcc or 'not found'}, torch {torch.__version__}, torch CUDA {torch.version.cuda})")
    return exts, {"build_ext": BuildExtension}, info


def _write_build_info(info):
    info = dict(info, git_sha=_git_sha())
    with open(os.path.join(ROOT, "rwkv", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time; describes the compiled extension.\n")
        f.write(f"BUILD_INFO = {info!r}\n")


ext_modules, cmdclass, build_info = _extensions()
if not SANITIZE:  # the sanitized build lives in its own folder; rwkv/_build_info.py is the normal build's
    _write_build_info(build_info)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
