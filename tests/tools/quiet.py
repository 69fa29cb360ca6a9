"""Shared by the test-data generators: silences native code that writes to fd 2."""
import contextlib
import os
import sys


@contextlib.contextmanager
def quiet_native_stderr():
    """llama.cpp's loader logs to fd 2 even with verbose=False; keep the fixture log readable."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
