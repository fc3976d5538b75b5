"""onebit's native c10d backend (csrc/c10d_backend.cc), built at first use against the torch in
this process.

The extension links torch's C++ ABI, which changes with every torch release, so it is not in the
wheel (which stays py3-none and torch-free): torch.utils.cpp_extension builds it the first time a
process asks, into torch's extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions;
a folder per source and torch, _extension_name; ranks starting together wait for one build), as DeepSpeed
builds its ops. That needs a C++ compiler and ninja; about 20 s. Without them the backend is the
Python one (backend.OnebitBackend), said once through the "onebit" logger with the reason and what
it costs (docs/usage.md, "Which torch").
"""
import hashlib
import os
import re
import threading

from ._logging import logger

__all__ = ["native_module"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "c10d_backend.cc")
_lock = threading.Lock()
_outcome = None  # (module, None) or (None, reason), once tried


def _without_comments(text):
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def _body(text, opening):
    """The text between the brace that follows `opening` and its match."""
    start = text.index("{", text.index(opening))
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    raise ValueError(f"no closing brace after {opening!r}")


def declared_virtuals(header):
    """Names of c10d::Backend's own virtual methods in the text of a Backend.hpp (not those of its
    nested classes, such as Options::clone)."""
    body = _body(_without_comments(header), "class TORCH_API Backend")
    for match in reversed(list(re.finditer(r"\b(?:struct|class)\s+\w+[^;{]*\{", body))):
        body = body.replace(_body(body[match.start():], match.group(0).split("{")[0]), "")
    return set(re.findall(r"\bvirtual\b[^;{(]*?\b(~?\w+)\s*\(", body))


def backend_header(torch):
    """The installed torch's c10d Backend.hpp."""
    return os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "distributed", "c10d", "Backend.hpp")


def _build():
    import torch
    from torch.utils import cpp_extension
    if not os.path.isfile(_SOURCE):
        return None, f"its source {_SOURCE} is not in this installation"
    try:
        with open(backend_header(torch)) as f:
            virtuals = declared_virtuals(f.read())
    except (OSError, ValueError) as failure:
        return None, f"torch {torch.__version__}'s c10d Backend.hpp cannot be read ({failure})"
    # The virtuals this torch declares: csrc/c10d_backend.cc compiles its override of each newer one
    # only where it exists.
    defines = [f"-DONEBIT_C10D_HAS_{name}" for name in sorted(virtuals) if not name.startswith("~")]
    try:
        module = cpp_extension.load(name=_extension_name(torch, defines), sources=[_SOURCE],
                                    extra_cflags=["-O2"] + defines, verbose=False)
    except Exception as failure:  # no compiler, no ninja, or torch's headers differ: the reason is the message
        lines = [line for line in str(failure).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        return None, f"building it against torch {torch.__version__} failed: {(errors or lines or ['?'])[0][:300]}"
    return module, None


def _extension_name(torch, defines):
    """onebit_c10d_ and a digest of the source, the torch and the defines: each onebit and torch on
    the machine builds into a folder of its own in the shared extension cache, once. (Under one name,
    two installations, or two checkouts of onebit, took turns rebuilding it at every job's start.)"""
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(" ".join([torch.__version__, os.path.dirname(torch.__file__)] + defines).encode())
    return "onebit_c10d_" + digest.hexdigest()[:12]


def native_module(required=False):
    """The built extension (its OnebitBackend class), or None when it cannot be built here — then
    the reason is logged once as a warning, or raised as RuntimeError when `required`."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _build()
            if _outcome[1] is not None and not required:
                logger.warning("the onebit backend runs as a Python c10d backend: its native form (csrc/c10d_backend.cc) "
                               "was not built (%s). The Python form gives the same results, but torch wraps its Work "
                               "objects: after wait(), is_completed() is False and result() raises, and dist.recv "
                               "without src fails (docs/usage.md, \"Which torch\")", _outcome[1])
    module, reason = _outcome
    if module is None and required:
        raise RuntimeError(f"onebit backend: the native c10d backend is not available: {reason}")
    return module
