"""OnebitError: what a failed call into onebit's C library raises."""

__all__ = ["OnebitError"]


class OnebitError(RuntimeError):
    """A call into onebit's C library failed. ``code`` is the call's onebit_result_t
    (include/onebit/onebit_types.h; the class constants below name them), ``str(error)`` the library's
    message for it (onebit_last_error). A RuntimeError, so code that catches RuntimeError — as
    torch.distributed's own errors are — catches it too.

    Example::

        try:
            optimizer.step()
        except onebit.OnebitError as error:
            if error.code == onebit.OnebitError.NUMERIC_ERROR:
                ...  # a NaN or Inf reached the compressed all_reduce
    """

    INVALID_ARGUMENT = 1  # the caller passed something wrong (bad dtype, size, hyper-parameter)
    SYSTEM_ERROR = 2  # the OS said no: socket, bind, memory
    TIMEOUT = 3  # a peer did not answer within ONEBIT_TIMEOUT_MS
    REMOTE_ERROR = 4  # a peer closed the connection or reported a failure
    MISMATCH = 5  # ranks disagree: tag, element count, dtype, op or call order
    NUMERIC_ERROR = 6  # a scale came out NaN or Inf: the input holds NaN or Inf
    INTERNAL_ERROR = 7  # a bug in onebit; please report it with the log

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)

    def __reduce__(self):  # pickled (a rank's error sent elsewhere) with its code, not RuntimeError's args only
        return type(self), (self.code, str(self))
