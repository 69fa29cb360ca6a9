"""Which vector extensions the llama.cpp of this environment was built for.

deploy/setup.sh --bench builds llama-cpp-python for the extensions the kernel reports (never
-march=native, which can enable AMX where the kernel does not let a process use it) and records
them beside the virtual environment; the bench scripts print them with every llama.cpp figure.
"""
import pathlib
import sys


def llamacpp_build():
    """'built for: AVX AVX2 ...', or how it was built when deploy/setup.sh did not record it."""
    stamp = pathlib.Path(sys.prefix) / ".llama-cpp-features"
    try:
        return "built for: " + stamp.read_text().strip()
    except OSError:
        return "built by pip's defaults (-march=native); deploy/setup.sh --bench records what it builds"
