"""Where onebit's C library comes from, mapped once per process (onebit._library()): the front
door preloaded into this process, else ONEBIT_LIBRARY, else this package's own libonebit.so, else
the loader's search path; and the paths of the package's other libraries. Private: the package's
face (onebit/__init__.py) re-exports lib_dir, nccl_net_plugin_path, nccl_preload_path and
OnebitNotLoaded.
"""
import ctypes
import ctypes.util
import os
import sys

from . import _capi


class OnebitNotLoaded(RuntimeError):
    pass


def _torch_bundles_gloo():
    """Whether the imported torch carries its own gloo (pip wheels) rather than linking the system
    libgloo.so.0: from libtorch_cpu.so's ELF dynamic section (DT_NEEDED), read without loading."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    path = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    try:
        return b"libgloo.so" not in _needed_libraries(path)
    except (OSError, ValueError):
        return False


def _needed_libraries(path):
    """The DT_NEEDED names of an ELF64 little-endian shared object, joined by NULs."""
    import struct
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise ValueError("not an ELF64 file")
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for i in range(phnum):
            kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
            if kind == 1:
                loads.append((vaddr, offset, filesz))
            elif kind == 2:
                dynamic = (offset, filesz)
        if dynamic is None:
            return b""
        f.seek(dynamic[0])
        entries = f.read(dynamic[1])
        needed, strtab = [], None
        for i in range(0, len(entries) - 15, 16):
            tag, value = struct.unpack_from("<qQ", entries, i)
            if tag == 0:
                break
            if tag == 1:
                needed.append(value)
            elif tag == 5:
                strtab = value
        if strtab is None:
            return b""
        base = next(offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size)
        names = []
        for value in needed:
            f.seek(base + value)
            names.append(f.read(256).split(b"\0", 1)[0])
        return b"\0".join(names)


def _check_preload_fits_torch(process):
    if hasattr(process, "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE") and _torch_bundles_gloo():
        raise OnebitNotLoaded(
            "libonebit-preload.so is preloaded, but this PyTorch bundles its own gloo (a pip wheel), which the "
            "preload cannot reach: its calls pass through untouched and nothing would be compressed. "
            "Unset LD_PRELOAD and use the onebit backend: onebit.register_backend(); "
            "dist.init_process_group(\"onebit\", ...) (docs/usage/pytorch.md)")


_HERE = os.path.dirname(os.path.abspath(__file__))
# A checkout's build tree, for developers who run the package from python/ of a built checkout.
_CHECKOUT_BUILD = os.path.normpath(os.path.join(_HERE, "..", "..", "build", "release"))


def lib_dir():
    """The folder of onebit's shared libraries that belong to this package: the wheel's onebit/lib
    (``pip install .``), else the build tree of the checkout the package sits in; None when neither
    holds libonebit.so (python/'s shim installed alone: set ONEBIT_LIBRARY, or preload a front door)."""
    from importlib import resources
    try:
        shipped = os.fspath(resources.files(__package__).joinpath("lib"))
    except TypeError:  # a package that is not a folder (a zip): nothing to load from
        shipped = os.path.join(_HERE, "lib")
    for folder in (shipped, _CHECKOUT_BUILD):
        if os.path.isfile(os.path.join(folder, "libonebit.so")):
            return folder
    return None


def nccl_net_plugin_path():
    """The absolute path of libnccl-net-onebit.so for NCCL_NET_PLUGIN (every wheel ships it).
    Raises OnebitNotLoaded, saying where it looked, when this package has no libraries."""
    folder = lib_dir()
    path = os.path.join(folder, "libnccl-net-onebit.so") if folder else None
    if path is None or not os.path.isfile(path):
        raise OnebitNotLoaded(
            f"libnccl-net-onebit.so is not part of this onebit package (looked in {_HERE}/lib and "
            f"{_CHECKOUT_BUILD}): install the wheel (pip install . from the repository) or build the checkout")
    return path


def nccl_preload_path():
    """The absolute path of libonebit-nccl-preload.so (the ncclAllReduce front door, for LD_PRELOAD),
    or None when this package has none: a wheel built where no CUDA compiler or nccl.h was found."""
    folder = lib_dir()
    path = os.path.join(folder, "libonebit-nccl-preload.so") if folder else None
    return path if path and os.path.isfile(path) else None


def _library():
    """onebit's C library, mapped once per process: the front door preloaded into this process if
    there is one (its copy of the C ABI is the one whose tags the interposed calls see), else
    ONEBIT_LIBRARY, else this package's own libonebit.so (lib_dir()), else the loader's search path."""
    global _loaded
    if _loaded is not None:
        return _loaded
    process = ctypes.CDLL(None)
    if hasattr(process, "onebit_tag"):
        _check_preload_fits_torch(process)
        lib = process
    else:
        folder = lib_dir()
        candidates = [os.environ.get("ONEBIT_LIBRARY"),
                      os.path.join(folder, "libonebit.so") if folder else None,
                      ctypes.util.find_library("onebit")]
        lib, failures = None, []
        for candidate in candidates:
            if candidate and (os.path.exists(candidate) or not os.path.isabs(candidate)):
                try:
                    lib = ctypes.CDLL(candidate)
                    break
                except OSError as error:
                    failures.append(f"{candidate}: {error}")
        if lib is None:
            tried = ("; tried " + "; ".join(failures)) if failures else ""
            raise OnebitNotLoaded(
                "onebit's C library was not found: install the wheel (pip install . from the repository), set "
                "ONEBIT_LIBRARY=/path/to/libonebit.so (with the onebit backend), or run with "
                f"LD_PRELOAD=/path/to/libonebit-preload.so (Debian's torch, gloo backend){tried}")
    _loaded = _capi.declare(lib)
    return lib



_loaded = None  # the library, once mapped
