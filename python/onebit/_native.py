"""onebit's native c10d backend (csrc/c10d_backend.cc): the module shipped for the torch the wheel
was built against, else one built at first use against the torch in this process.

The extension links torch's C++ ABI and CPython's, which change with every release. The wheel
carries one built against the torch it was built beside (onebit_c10d.so, with onebit_c10d.json
saying for which torch, git revision and Python extension ABI, and from which source), next to libonebit.so; it
is loaded only where all of them match. Elsewhere torch.utils.cpp_extension builds it the first
time a process asks, into torch's extension cache (TORCH_EXTENSIONS_DIR, else
~/.cache/torch_extensions; a folder per source and torch, _extension_name; ranks starting
together wait for one build), said once through the "onebit" logger. That needs a C++ compiler and
ninja; about 20 s. Without them the backend cannot be made here, and init_process_group("onebit")
raises a RuntimeError saying why (docs/usage/pytorch.md, "Which torch").

    python -c 'from onebit import _native; _native.build_into("DIR")'   # what the wheel's build runs
"""
import hashlib
import json
import os
import re
import shutil
import sysconfig
import tempfile
import threading

from ._logging import logger

__all__ = ["native_module", "build_into"]

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_SOURCE = os.path.join(_CSRC, "c10d_backend.cc")
_PREBUILT = "onebit_c10d"  # the shipped module's name: onebit_c10d.so, onebit_c10d.json
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
    return os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "distributed", "c10d",
                        "Backend.hpp")


def _defines(torch):
    """-DONEBIT_C10D_HAS_<name> for each virtual this torch's Backend declares: csrc/c10d_backend.cc
    compiles its override of each newer one only where it exists."""
    with open(backend_header(torch)) as f:
        virtuals = declared_virtuals(f.read())
    return [f"-DONEBIT_C10D_HAS_{name}" for name in sorted(virtuals) if not name.startswith("~")]


def _source_digest():
    """The digest of what the module is compiled from: the backend's source and the C ABI's headers it
    includes (onebit.h and the onebit_types.h that onebit.h includes)."""
    digest = hashlib.sha256()
    for name in ("c10d_backend.cc", "onebit.h", "onebit_types.h"):
        with open(os.path.join(_CSRC, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _made_for(torch):
    """What a built module is good for: this torch, its revision, this Python, this source."""
    return dict(torch=torch.__version__, torch_git=getattr(torch.version, "git_version", ""),
                python=sysconfig.get_config_var("EXT_SUFFIX"), source=_source_digest())


def _compile(torch, name, build_directory=None):
    from torch.utils import cpp_extension
    return cpp_extension.load(name=name, sources=[_SOURCE], extra_cflags=["-O2"] + _defines(torch),
                              build_directory=build_directory, verbose=False)


def build_into(folder):
    """Builds the module against the torch in this process into `folder` (onebit_c10d.so and
    onebit_c10d.json): what the wheel's build runs with the Python it builds beside."""
    import torch
    with tempfile.TemporaryDirectory() as scratch:
        module = _compile(torch, _PREBUILT, build_directory=scratch)
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(module.__file__, os.path.join(folder, _PREBUILT + ".so"))
    with open(os.path.join(folder, _PREBUILT + ".json"), "w") as f:
        json.dump(_made_for(torch), f, indent=1, sort_keys=True)


def _library_folder():
    """The folder of the libonebit.so this process loaded: where the wheel puts the prebuilt module."""
    from . import _library
    path = getattr(_library(), "_name", None)
    return os.path.dirname(os.path.realpath(path)) if isinstance(path, str) and os.path.isabs(path) else None


def _prebuilt(torch):
    """(the shipped module, None) when it was built for this torch and Python from this source,
    else (None, why not): also when its record or the module cannot be read or loaded (an
    interrupted copy), which the build here then replaces."""
    try:
        return _load_prebuilt(torch)
    except (OSError, ValueError, ImportError, AttributeError, TypeError) as failure:
        return None, f"the prebuilt module could not be loaded ({type(failure).__name__}: {failure})"


def _load_prebuilt(torch):
    folder = _library_folder()
    record = os.path.join(folder, _PREBUILT + ".json") if folder else None
    if record is None or not os.path.isfile(record):
        return None, "no prebuilt module beside libonebit.so"
    with open(record) as f:
        made = dict(json.load(f))
    wanted = _made_for(torch)
    differ = [key for key in ("torch", "torch_git", "python", "source") if made.get(key) != wanted[key]]
    if differ:
        said = {"torch": f"torch {made.get('torch')}", "torch_git": f"torch's revision {made.get('torch_git')}",
                "python": f"Python {made.get('python')}", "source": "another source"}
        return None, f"the prebuilt module was made for {', '.join(said[key] for key in differ)}"
    import importlib.machinery
    import importlib.util
    path = os.path.join(folder, _PREBUILT + ".so")
    loader = importlib.machinery.ExtensionFileLoader(_PREBUILT, path)
    spec = importlib.util.spec_from_file_location(_PREBUILT, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module, None


def _build_here(torch):
    if not os.path.isfile(_SOURCE):
        return None, f"its source {_SOURCE} is not in this installation"
    try:
        defines = _defines(torch)
        name = _extension_name(torch, defines)
    except (OSError, ValueError) as failure:
        return None, f"torch {torch.__version__}'s c10d Backend.hpp or onebit's source cannot be read ({failure})"
    try:
        return _compile(torch, name), None
    except Exception as failure:  # no compiler, no ninja, or torch's headers differ: the reason is the message
        lines = [line for line in str(failure).splitlines() if line.strip()]
        errors = [line for line in lines if "error:" in line] or [line for line in lines if "error" in line.lower()]
        return None, f"building it against torch {torch.__version__} failed: {(errors or lines or ['?'])[0][:300]}"


def _extension_name(torch, defines):
    """onebit_c10d_ and a digest of the source, the torch and the defines: each onebit and torch on
    the machine builds into a folder of its own in the shared extension cache, once. (Under one name,
    two installations, or two checkouts of onebit, took turns rebuilding it at every job's start.)"""
    digest = hashlib.sha256(_source_digest().encode())
    digest.update(" ".join([torch.__version__, os.path.dirname(torch.__file__)] + defines).encode())
    return "onebit_c10d_" + digest.hexdigest()[:12]


def _load(torch):
    module, why_not = _prebuilt(torch)
    if module is not None:
        return module, None
    # A warning where a shipped module does not fit (a wheel beside another torch); where none was
    # shipped (the CMake path, python/'s shim) building here is the way it is made.
    say = logger.warning if why_not.startswith("the prebuilt") else logger.debug
    say("building the onebit backend's native module for torch %s (%s): once per torch, about 20 s, with a C++ "
        "compiler and ninja (docs/usage/pytorch.md, \"Which torch\")", torch.__version__, why_not)
    return _build_here(torch)


def native_module():
    """The backend's module (its OnebitBackend class): the prebuilt one where it fits this torch,
    else one built here. Raises RuntimeError naming the reason when neither can be had."""
    global _outcome
    with _lock:
        if _outcome is None:
            import torch
            _outcome = _load(torch)
    module, reason = _outcome
    if module is None:
        raise RuntimeError(f"onebit backend: its native module cannot be loaded or built here: {reason}. Install the "
                           "onebit wheel built for this torch, or give this machine a C++ compiler and ninja "
                           "(docs/usage/pytorch.md, \"Which torch\")")
    return module
