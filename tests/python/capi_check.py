"""python/onebit/_capi.py against the C headers: the ctypes declarations of the shim must say what
include/onebit/onebit.h, the onebit_types.h it includes, and preload.h say.

    capi_check.py SOURCE_DIR [LIBRARY]

Checks that every ONEBIT_API function of the headers is in _capi.PROTOTYPES (and nothing else is),
with as many arguments, each argument and the result of a matching ctypes type (the spelling
rules of _capi's docstring); that every `typedef struct` is in _capi.STRUCTS (and nothing else is)
with the same field names in the same order and matching types. Then it checks the checker: each
of a few deliberately wrong declarations (an argument dropped, a result widened, a field renamed,
a function missing, a struct pointer passed as a scalar) must be reported. With LIBRARY (a built
libonebit.so), _capi.declare() runs on it, every declared function must be there, and two calls
through the declarations return what the header promises. onebit_types.h, the types the library's
core may use, must declare no function.

Needs neither torch nor a build: /usr/bin/python3 and the source tree. Exit 0 on success, 1 with
the problems listed.
"""
import ctypes
import importlib.util
import os
import re
import sys

_SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t,
            "float": ctypes.c_float, "double": ctypes.c_double, "char": ctypes.c_char}


def _strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def parse_headers(paths):
    """(functions, structs, enums, opaque) of the headers: functions name -> (result C type,
    [argument C types]); structs name -> [(field, C type)]; enums and opaque pointer typedefs as
    sets of names."""
    functions, structs, enums, opaque = {}, {}, set(), set()
    for path in paths:
        with open(path) as f:
            text = _strip_comments(f.read())
        enums.update(re.findall(r"typedef\s+enum\s*\{.*?\}\s*(\w+)\s*;", text, flags=re.S))
        opaque.update(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text))
        for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
            fields = []
            for declaration in filter(None, (d.strip() for d in body.split(";"))):
                first, *rest = [part.strip() for part in declaration.split(",")]
                ctype, field = re.match(r"(.*?)(\w+)$", first, flags=re.S).groups()
                ctype = " ".join(ctype.split())
                fields.append((field, ctype))
                fields += [(other, ctype) for other in rest]
            structs[name] = fields
        for result, name, args in re.findall(r"ONEBIT_API\s+([^;()]*?)\b(onebit_\w+)\s*\(([^)]*)\)\s*;", text):
            args = [" ".join(a.split()) for a in args.split(",")]
            if args == ["void"]:
                args = []
            # An argument's type: the declaration without its name (every prototype names them).
            types = [re.match(r"(.*?)\s*\w+$", a).group(1).strip() if re.search(r"[\w*]\s*\w+$", a) else a
                     for a in args]
            functions[name] = (" ".join(result.split()), types)
    return functions, structs, enums, opaque


def _problem_with(ctype, declared, capi, enums, opaque):
    """Why the ctypes type `declared` does not match the C type `ctype`, or None."""
    text = re.sub(r"\s+", " ", re.sub(r"\bconst\b", "", ctype)).replace(" *", "*").strip()  # "const char* const*"
    depth = text.count("*")
    base = text.replace("*", "").strip()
    if depth == 0:
        if base == "void":
            return None if declared is None else f"void declared as {declared}"
        if base in enums:
            wanted = ctypes.c_int
        elif base in opaque:
            wanted = ctypes.c_void_p
        elif base in capi.STRUCTS:
            wanted = capi.STRUCTS[base]
        elif base in _SCALARS:
            wanted = _SCALARS[base]
        else:
            return f"unknown C type {ctype!r}"
        return None if declared is wanted else f"{ctype} declared as {getattr(declared, '__name__', declared)}"
    pointee = "*".join([base] + [""] * (depth - 1)) if depth > 1 else base
    if declared is ctypes.c_char_p:
        return None if (base, depth) == ("char", 1) else f"{ctype} declared as c_char_p"
    if declared is ctypes.c_void_p:
        # A data pointer: its pointee is bytes the callee reads or writes (float*, void*), never a
        # struct or a scalar out-parameter, which must be POINTER(...) so byref(...) type-checks.
        return None if (base, depth) in (("float", 1), ("void", 1)) else f"{ctype} declared as c_void_p"
    target = getattr(declared, "_type_", None)
    if not isinstance(declared, type) or not issubclass(declared, ctypes._Pointer) or target is None:
        return f"{ctype} declared as {getattr(declared, '__name__', declared)}, not a pointer"
    return _problem_with(pointee, target, capi, enums, opaque)


def check(capi, headers):
    functions, structs, enums, opaque = headers
    problems = []
    for name in sorted(set(functions) - set(capi.PROTOTYPES)):
        problems.append(f"{name}: in the header, not declared in _capi")
    for name in sorted(set(capi.PROTOTYPES) - set(functions)):
        problems.append(f"{name}: declared in _capi, not in the header")
    for name in sorted(set(functions) & set(capi.PROTOTYPES)):
        (result, args), (restype, argtypes) = functions[name], capi.PROTOTYPES[name]
        if len(args) != len(argtypes):
            problems.append(f"{name}: {len(args)} arguments in the header, {len(argtypes)} declared")
            continue
        why = _problem_with(result, restype, capi, enums, opaque)
        if why:
            problems.append(f"{name}: result: {why}")
        for index, (ctype, declared) in enumerate(zip(args, argtypes)):
            why = _problem_with(ctype, declared, capi, enums, opaque)
            if why:
                problems.append(f"{name}: argument {index + 1}: {why}")
    for name in sorted(set(structs) - set(capi.STRUCTS)):
        problems.append(f"{name}: a struct of the header, not in _capi.STRUCTS")
    for name in sorted(set(capi.STRUCTS) - set(structs)):
        problems.append(f"{name}: in _capi.STRUCTS, not a struct of the header")
    for name in sorted(set(structs) & set(capi.STRUCTS)):
        fields, declared = structs[name], capi.STRUCTS[name]._fields_
        if [f for f, _ in fields] != [f for f, _ in declared]:
            problems.append(f"{name}: fields {[f for f, _ in fields]} in the header, "
                            f"{[f for f, _ in declared]} declared")
            continue
        for (field, ctype), (_, type_) in zip(fields, declared):
            why = _problem_with(ctype, type_, capi, enums, opaque)
            if why:
                problems.append(f"{name}.{field}: {why}")
    return problems


class _Mutated:
    """_capi with one thing wrong."""

    def __init__(self, capi, prototypes=None, structs=None):
        self.PROTOTYPES = dict(capi.PROTOTYPES, **(prototypes or {}))
        self.STRUCTS = dict(capi.STRUCTS, **(structs or {}))


def check_the_check(capi, headers):
    """Each wrong declaration must be reported: returns the ones that were not."""
    missing = _Mutated(capi)
    del missing.PROTOTYPES["onebit_allreduce"]
    restype, argtypes = capi.PROTOTYPES["onebit_tag"]

    class Renamed(ctypes.Structure):
        _fields_ = [("window", ctypes.c_int64), ("threshold", ctypes.c_double), ("max_steps", ctypes.c_int64)]

    class Narrowed(ctypes.Structure):
        _fields_ = [("window", ctypes.c_int64), ("threshold", ctypes.c_float), ("max_step", ctypes.c_int64)]

    wrong = {
        "an argument dropped": _Mutated(capi, {"onebit_tag": (restype, argtypes[:-1])}),
        "int64 result declared int": _Mutated(capi, {"onebit_adam_freeze_step": (ctypes.c_int, (ctypes.c_int64,))}),
        "float result left int": _Mutated(capi, {"onebit_adam_step_bound": (ctypes.c_int, (ctypes.c_float,) * 2)}),
        "a size declared int": _Mutated(capi, {"onebit_tag": (restype, argtypes[:2] + (ctypes.c_int,) + argtypes[3:])}),
        "a struct pointer as c_void_p": _Mutated(capi, {"onebit_lamb_layer_init": (ctypes.c_int, (ctypes.c_void_p,))}),
        "an out-pointer to the wrong scalar": _Mutated(
            capi, {"onebit_tag_state_size": (ctypes.c_int, (ctypes.c_char_p,) + (ctypes.POINTER(ctypes.c_int),) * 2)}),
        "a function missing": missing,
        "a function the header lacks": _Mutated(capi, {"onebit_bogus": (ctypes.c_int, ())}),
        "a field renamed": _Mutated(capi, structs={"onebit_adam_auto_freeze_t": Renamed}),
        "a field's type changed": _Mutated(capi, structs={"onebit_adam_auto_freeze_t": Narrowed}),
    }
    return [what for what, mutated in wrong.items() if not check(mutated, headers)]


def check_library(capi, path, headers):
    """declare() on a built library; every declared function there (preload-only ones aside), and
    two calls through the declarations."""
    problems = []
    lib = capi.declare(ctypes.CDLL(path))
    preload_only = {"onebit_preload_stats"}
    for name in sorted(set(capi.PROTOTYPES) - preload_only):
        if not hasattr(lib, name):
            problems.append(f"{name}: declared, not exported by {path}")
    if lib.onebit_result_string(1) != b"ONEBIT_INVALID_ARGUMENT":
        problems.append(f"onebit_result_string(1) = {lib.onebit_result_string(1)!r}")
    bound = lib.onebit_adam_step_bound(0.9, 0.999)  # a float result: an int restype would say garbage
    if not 7.2 < bound < 7.3:
        problems.append(f"onebit_adam_step_bound(0.9, 0.999) = {bound}, not about 7.27")
    return problems


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    source = os.path.abspath(sys.argv[1])
    spec = importlib.util.spec_from_file_location("onebit_capi", os.path.join(source, "python", "onebit", "_capi.py"))
    capi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capi)
    names = ("onebit_types.h", "onebit.h", "preload.h")
    headers = parse_headers([os.path.join(source, "include", "onebit", name) for name in names])
    if len(headers[0]) < 40 or len(headers[1]) < 9:  # the parser found what the headers hold
        print(f"FAIL: parsed only {len(headers[0])} functions and {len(headers[1])} structs from the headers")
        return 1
    types_only = parse_headers([os.path.join(source, "include", "onebit", "onebit_types.h")])
    problems = [f"onebit_types.h declares {name}: it holds types only" for name in sorted(types_only[0])]
    problems += check(capi, headers)
    problems += [f"the check missed: {what}" for what in check_the_check(capi, headers)]
    if len(sys.argv) == 3:
        problems += check_library(capi, sys.argv[2], headers)
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        return 1
    print(f"ok: {len(headers[0])} functions and {len(headers[1])} structs of the headers declared alike in _capi"
          + (f"; declare() on {sys.argv[2]} works" if len(sys.argv) == 3 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
