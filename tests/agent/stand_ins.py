"""A stand-in llama.cpp: a one-file C++ `llama-server` packed like a llama-cpp-python sdist (vendor/llama.cpp).

Put in the agent's download cache it is built for real by cmake and g++, in seconds
and without the network. It answers --version and otherwise waits to be stopped.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

SERVER = r"""
#include <cstdio>
#include <cstring>
#include <unistd.h>
int main(int argc, char ** argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) { fprintf(stderr, "version: 9 (stand-in)\n"); return 0; }
    }
    pause();
}
"""
CMAKE = """
cmake_minimum_required(VERSION 3.14)
project(llama.cpp CXX)
add_executable(llama-server server.cpp)
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""
BROKEN = 'cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp CXX)\nmessage(FATAL_ERROR "broken on purpose")\n'


def seed_sdist(cache: Path, version: str, cmake: str = CMAKE) -> Path:
    """A llama-cpp-python sdist as `pip download` leaves it, already in the cache's sources."""
    sources = cache / "llama.cpp" / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    sdist = sources / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in {
            "CMakeLists.txt": cmake,
            "server.cpp": SERVER,
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{version}/vendor/llama.cpp/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        # The Python binding around it, which is not unpacked.
        info = tarfile.TarInfo(f"llama_cpp_python-{version}/llama_cpp/__init__.py")
        archive.addfile(info, io.BytesIO(b""))
    return sdist
