"""One rank's checkpoint as a file of named records (onebit.h, "Checkpoint files"): the format the
C++ shims' save_file()/load_file() write and read too, so a checkpoint resumes in either language.
A part's fields map to records by one rule: a tensor is float32 values; an int or a bool an int64;
a dict of ints (ZeroOneAdam's schedule) one int64 record per key, "schedule.step"; a list of dicts
(OnebitLamb's layers) one float64 record per key, "layers.coeff_freeze", one value a layer;
OnebitAdam's variance_changes two records, "variance_changes.step" and ".change"; ZeroOneAdam's lrs
float32 values. A job's one file holds what every rank holds alike under those names and each rank
r's own fields under "rank<r>/" before them; each rank reads its view of it (onebit.h). Private:
the optimizers' save_file() and load_file() use it."""
from __future__ import annotations

import ctypes
import weakref

import torch

from . import _check
from ._errors import OnebitError

_INT, _INTS, _FLOATS, _DOUBLES, _TEXT = 1, 2, 3, 4, 5  # onebit_record_kind_t
# What every optimizer's file holds (the C++ shims' put_common_records).
_REQUIRED = ("optimizer", "rank", "world_size", "local_size", "m", "v", "worker_error", "server_error")


class _File:
    """An onebit_checkpoint_t handle, destroyed with this object: records to write whole; streamed
    to `stream_to` as they are put; or rank `rank`'s view of the file at `path`."""

    def __init__(self, lib, path=None, rank=0, stream_to=None):
        self._lib, handle = lib, ctypes.c_void_p()
        if stream_to is not None:
            _check(lib, lib.onebit_checkpoint_stream(stream_to.encode(), ctypes.byref(handle)))
        elif path is None:
            _check(lib, lib.onebit_checkpoint_create(ctypes.byref(handle)))
        else:
            _check(lib, lib.onebit_checkpoint_read_rank(path.encode(), rank, ctypes.byref(handle)))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.onebit_checkpoint_destroy, handle)

    def close(self):
        """Destroys the handle now (a stream not committed: its temporary file removed)."""
        self._finalizer()

    def put(self, name, value):
        lib, key = self._lib, name.encode()
        if isinstance(value, str):
            _check(lib, lib.onebit_checkpoint_put_text(self._handle, key, value.encode()))
        elif isinstance(value, (bool, int)):
            _check(lib, lib.onebit_checkpoint_put_int(self._handle, key, int(value)))
        elif isinstance(value, torch.Tensor):
            values = value.detach().to("cpu", torch.float32).contiguous()
            _check(lib, lib.onebit_checkpoint_put_floats(self._handle, key, ctypes.c_void_p(values.data_ptr()),
                                                         values.numel()))
        else:
            kind, function = (ctypes.c_int64, lib.onebit_checkpoint_put_ints) if value[1] == "ints" else (
                ctypes.c_double, lib.onebit_checkpoint_put_doubles)
            _check(lib, function(self._handle, key, (kind * len(value[0]))(*value[0]), len(value[0])))

    def write(self, path):
        _check(self._lib, self._lib.onebit_checkpoint_write(self._handle, path.encode()))

    def commit(self):
        _check(self._lib, self._lib.onebit_checkpoint_commit(self._handle))

    def records(self):
        """{name: value} of every record: ints as int, texts as str, float32 values as a tensor,
        int64 and float64 values as lists."""
        lib, count = self._lib, ctypes.c_size_t()
        _check(lib, lib.onebit_checkpoint_names(self._handle, None, 0, ctypes.byref(count)))
        names = (ctypes.c_char_p * count.value)()
        _check(lib, lib.onebit_checkpoint_names(self._handle, names, count, ctypes.byref(count)))
        return {name.decode(): self._get(name) for name in names}

    def _get(self, key):
        lib, kind, count = self._lib, ctypes.c_int(), ctypes.c_size_t()
        _check(lib, lib.onebit_checkpoint_record(self._handle, key, ctypes.byref(kind), ctypes.byref(count)))
        n = count.value
        if kind.value == _INT:
            value = ctypes.c_int64()
            _check(lib, lib.onebit_checkpoint_get_int(self._handle, key, ctypes.byref(value)))
            return value.value
        if kind.value == _TEXT:
            text = ctypes.create_string_buffer(n + 1)
            _check(lib, lib.onebit_checkpoint_get_text(self._handle, key, text, n + 1, None))
            return text.value.decode()
        if kind.value == _FLOATS:
            values = torch.zeros(n, dtype=torch.float32)
            _check(lib, lib.onebit_checkpoint_get_floats(self._handle, key, ctypes.c_void_p(values.data_ptr()), n))
            return values
        array, function = ((ctypes.c_int64 * n)(), lib.onebit_checkpoint_get_ints) if kind.value == _INTS else (
            (ctypes.c_double * n)(), lib.onebit_checkpoint_get_doubles)
        _check(lib, function(self._handle, key, array, n))
        return list(array)


def write_part(lib, path, part, header):
    """Writes checkpoint part `part` (a dict of an optimizer's _onebit_state()) with `header` (who
    wrote it, its rank and layout) to `path`."""
    file = _File(lib)
    _put_fields(file, dict(header, **part))
    file.write(path)


def write_job(lib, path, shared, parts):
    """Writes the job's one file to `path`, streamed: `shared` (the header and what every rank holds
    alike) under its names, then each part of `parts` (rank r's own fields, r = 0, 1, ...: an
    iterable, each part dropped once written) under "rank<r>/". Returns None, or the OnebitError
    that stopped the writing (any other exception as one): the remaining parts are still taken
    from `parts` (the ranks sending them are not left waiting) and the path is left as it was, its
    temporary file removed at once."""
    failure, file = None, None
    try:
        file = _File(lib, stream_to=path)
        _put_fields(file, shared)
    except Exception as error:  # noqa: BLE001 — any failure: every rank must learn it, none wait
        failure = _as_onebit_error(error)
    rank, parts = 0, iter(parts)
    while True:
        part = next(parts, None)  # the last part is dropped before the next one arrives
        if part is None:
            break
        if failure is None:
            try:
                _put_fields(file, part, prefix=f"rank{rank}/")
            except Exception as error:  # noqa: BLE001
                failure = _as_onebit_error(error)
        part, rank = None, rank + 1
    if failure is None:
        try:
            file.commit()
        except Exception as error:  # noqa: BLE001
            failure = _as_onebit_error(error)
    if file is not None:
        file.close()
    return failure


def _as_onebit_error(error):
    return error if isinstance(error, OnebitError) else OnebitError(OnebitError.SYSTEM_ERROR, repr(error))


def _put_fields(file, fields, prefix=""):
    for field, value in fields.items():
        name = prefix + field
        if value is None:
            continue
        if field == "variance_changes":
            file.put(name + ".step", ([int(s) for s, _ in value], "ints"))
            file.put(name + ".change", ([float(c) for _, c in value], "doubles"))
        elif field == "lrs":
            file.put(name, torch.tensor(value, dtype=torch.float32))
        elif isinstance(value, dict):
            for key, item in value.items():
                file.put(f"{name}.{key}", int(item))
        elif isinstance(value, list):  # a dict a layer
            for key in (value[0] if value else {}):
                file.put(f"{name}.{key}", ([float(layer[key]) for layer in value], "doubles"))
        else:
            file.put(name, value)


def read_part(lib, path, rank):
    """(header, part) of rank `rank`'s view of the checkpoint file at `path` (its own file, or its
    part of a job's): the inverse of write_part and write_job."""
    records = _File(lib, path, rank).records()
    part = {}
    for name, value in records.items():
        outer, _, inner = name.partition(".")
        if not inner:
            part[name] = value.tolist() if name == "lrs" and isinstance(value, torch.Tensor) else value
        elif outer == "variance_changes":
            part.setdefault(outer, [None] * len(value))
        elif isinstance(value, list):  # a dict a layer
            layers = part.setdefault(outer, [{} for _ in value])
            for layer, item in zip(layers, value):
                layer[inner] = item
        else:
            part.setdefault(outer, {})[inner] = value
    missing = [name for name in _REQUIRED if name not in records]
    if missing:
        raise ValueError(f"{path} lacks the record{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    if "variance_changes" in part:
        steps, changes = records.get("variance_changes.step"), records.get("variance_changes.change")
        if not isinstance(steps, list) or not isinstance(changes, list) or len(steps) != len(changes):
            raise ValueError(f"{path}: variance_changes.step and .change are not two lists of one length")
        part["variance_changes"] = list(zip(steps, changes))
    header = {key: part.pop(key, None) for key in ("optimizer", "rank", "local_size")}
    header["world_size"] = part.get("world_size")
    return header, part
