"""Forwarding by construction (the Python form of the onebit backend; the native one is
csrc/c10d_backend.cc): a Python c10d Backend that hands every method it does not define
itself to a wrapped backend object (the onebit backend's gloo group).

torch calls a Python Backend subclass through a pybind11 trampoline (c10d::PyBackend,
torch/csrc/distributed/c10d/py/PyBackend.hpp; a private torch API, checked on torch 2.15.0 from
PyPI). For each virtual it asks pybind11's get_override for the method's Python name, and calls
the C++ base class — c10d::Backend, whose collectives throw "does not support ..." — unless the
attribute found on the instance's type is something other than the base's own bound function. A
name the subclass does not define therefore reaches the base, never gloo: forwarding has to be a
real attribute of the class (not __getattr__, which the lookup on the type never reaches) for every
name in torch's table, and the table grows with torch (2.15 added all_gather_single,
reduce_scatter_single, all_to_all_single and their _coalesced forms, renaming what older torch
called _allgather_base, _reduce_scatter_base and alltoall_base).

So the forwarders are generated at import from the installed torch's Backend method table
(vars(torch._C._distributed_c10d.Backend)): whatever torch dispatches to, under whatever name
this torch uses, is forwarded with its arguments as given (*args, **kwargs), and the Work (or
value) gloo returns is returned as it is. Properties are forwarded as properties: the trampoline
reads supports_splitting, supports_coalescing, options, ... through ordinary attribute lookup,
and the base's own property would call the same C++ virtual again (a RecursionError).
"""
import torch

__all__ = ["forward_backend_methods", "allreduce_arguments"]

# Not forwarded: what belongs to the wrapping backend itself rather than to the backend it wraps.
# name() and _get_backend_name() answer with the subclass's getBackendName(); rank() and size() are
# the same numbers on both and must keep answering after the wrapped backend is released; the rest
# is Python's and pybind11's own machinery.
_KEPT = frozenset({"name", "_get_backend_name", "rank", "size", "_pybind11_conduit_v1_"})


# Names under which c10d::PyBackend looks a virtual up that differ from the binding's name in the
# table (torch 2.15.0): the trampoline asks for "start_coalescing" where Python code calls
# "_start_coalescing", for the C++ names of the abort hooks. Each is forwarded under both.
_TRAMPOLINE_ALIASES = {"_start_coalescing": "start_coalescing", "_end_coalescing": "end_coalescing",
                       "register_abort_hook": "registerAbortHook", "unregister_abort_hook": "unregisterAbortHook"}


def _trampoline_call(name, args, kwargs):
    """Where the trampoline passes C++ arguments that the binding of the same name takes in another
    form (torch 2.15.0), those arguments in the binding's form; other calls as given."""
    dist = torch.distributed
    if name == "monitored_barrier" and args and isinstance(args[0], dist.BarrierOptions):
        # monitoredBarrier(const BarrierOptions&, bool waitAllRanks); the binding takes (timeout, wait_all_ranks)
        return (args[0].timeout,) + tuple(args[1:]), kwargs
    if name == "supports_tensor_alloc" and args and isinstance(args[0], int):
        # supportsTensorAlloc(DeviceIndex); the binding takes a torch.device. A CPU backend's index.
        return (torch.device("cpu", args[0]),) + tuple(args[1:]), kwargs
    return args, kwargs


# State that torch's C++ side reads from the wrapping backend itself, not through a virtual the
# trampoline forwards: ProcessGroup::getGroupName() is the first backend's getGroupUid() (a plain
# member, torch 2.15.0), so the group uid is set on both. (Settable properties, such as
# bound_device_id, are set on both likewise.)
_SET_ON_BOTH = frozenset({"_set_group_uid"})


def _method(name, doc):
    base = torch._C._distributed_c10d.Backend

    def forward(self, *args, **kwargs):
        if name in _SET_ON_BOTH:
            # The base's binding calls the virtual, whose trampoline recognises this frame as the
            # override of `name` on self (pybind11 compares the frame's code name and first
            # argument) and runs c10d::Backend's own implementation.
            getattr(base, name)(self, *args, **kwargs)
        args, kwargs = _trampoline_call(name, args, kwargs)
        return getattr(self._forward_target(), name)(*args, **kwargs)
    # The code object carries the name too: pybind11's get_override recognises a call made from
    # within an override by the frame's code name, and tracebacks show it.
    forward.__code__ = forward.__code__.replace(co_name=name)
    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"As the wrapped backend's {name} (forwarded).\n\n{doc or ''}".rstrip()
    return forward


def _property(name, member):
    def get(self):
        return getattr(self._forward_target(), name)

    def set_(self, value):
        member.fset(self, value)
        setattr(self._forward_target(), name, value)
    return property(get, set_ if member.fset is not None else None, doc=f"The wrapped backend's {name} (forwarded).")


def forward_backend_methods(cls):
    """Gives `cls` (a subclass of torch's c10d Backend with a `_forward_target()` method returning
    the backend to forward to) a forwarder for every method and property of the installed torch's
    Backend that `cls` does not define itself. Returns the names forwarded, sorted."""
    base = torch._C._distributed_c10d.Backend
    forwarded = []
    for name, member in vars(base).items():
        if name.startswith("__") or name in _KEPT or any(name in vars(k) for k in cls.__mro__ if k is not base and issubclass(k, base)):
            continue
        if isinstance(member, property):
            setattr(cls, name, _property(name, member))
        elif callable(member) and not isinstance(member, type):
            setattr(cls, name, _method(name, getattr(member, "__doc__", "")))
            if name in _TRAMPOLINE_ALIASES and _TRAMPOLINE_ALIASES[name] not in vars(cls):
                setattr(cls, _TRAMPOLINE_ALIASES[name], getattr(cls, name))
        else:
            continue
        forwarded.append(name)
    return sorted(forwarded)


def allreduce_arguments(*args, **kwargs):
    """(tensors, opts) of a call to Backend.allreduce in any of the forms torch's binding accepts
    (torch 2.15.0's three overloads): (tensors, opts=AllreduceOptions()), (tensors, op=SUM, timeout=None) and
    (tensor, op=SUM, timeout=None), positional or by keyword. What a backend needs to decide
    whether a call is its own; the call itself is forwarded as given, so that the wrapped backend
    accepts and refuses exactly what it always did."""
    dist = torch.distributed
    first = args[0] if args else kwargs.get("tensors", kwargs.get("tensor"))
    tensors = [first] if isinstance(first, torch.Tensor) else list(first) if first is not None else []
    rest = args[1:]
    if rest and isinstance(rest[0], dist.AllreduceOptions):
        return tensors, rest[0]
    if "opts" in kwargs:
        return tensors, kwargs["opts"]
    opts = dist.AllreduceOptions()
    opts.reduceOp = rest[0] if rest else kwargs.get("op", dist.ReduceOp.SUM)
    timeout = rest[1] if len(rest) > 1 else kwargs.get("timeout")
    if timeout is not None:
        opts.timeout = timeout
    return tensors, opts
