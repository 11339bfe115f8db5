"""Builds the `equarx` wheel with setuptools-rust (see pyproject.toml).

What goes in:

- ``equarx/`` from ``python/equarx`` (the Python door);
- the ``equarx`` CLI (the root package's binary) as a script, so that it
  lands on the venv's ``bin/``;
- ``equarx/libequarx.so``, the cdylib of ``core/``, under its own name: the
  package loads it with ctypes, it is no CPython extension module.

One cargo command builds both binaries: ``cargo build --release --locked``
of the workspace (its default members, the CLI and core), the very build a
developer runs, so the two share cargo's fingerprints and nothing is
compiled twice. (setuptools-rust's own way to a cdylib, ``cargo rustc
--crate-type cdylib`` on core, shares core's fingerprint with ``cargo
build`` and overwrites it: every wheel, then every ``cargo build``, would
recompile core.) The library is taken from the directory cargo put the CLI
in, so ``CARGO_TARGET_DIR`` and a ``SETUPTOOLS_RUST_CARGO_PROFILE`` are
followed.

The wheel is tagged ``py3-none-<platform>``: nothing in it depends on the
Python version or ABI, only on the platform's C and C++ runtime. The
platform is setuptools' (``linux_x86_64``); ``scripts/wheel`` asks
``auditwheel`` which manylinux policy the binaries meet and retags to that.
The version is ``core/Cargo.toml``'s, the one source. setuptools' own
output goes under ``target/setuptools``.
"""

import pathlib
import shutil
import subprocess
import tomllib

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import RustBin, Strip, build_rust

ROOT = pathlib.Path(__file__).resolve().parent
LIBRARY = "libequarx.so"
# setuptools' own output, out of the source tree. egg_info refuses a
# directory that does not exist, as in a fresh clone.
BUILD = ROOT / "target" / "setuptools"
BUILD.mkdir(parents=True, exist_ok=True)


def core_version() -> str:
    with open(ROOT / "core" / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


class build_rust_and_library(build_rust):
    """Builds the CLI, then puts the library the same cargo build made into
    the package."""

    def build_extension(self, ext):
        built, out_dir = super().build_extension(ext)
        self._cargo_output = pathlib.Path(built[0].path).parent
        return built, out_dir

    def run(self):
        super().run()
        library = self._cargo_output / LIBRARY
        if not library.is_file():
            raise FileNotFoundError(
                f"cargo built the CLI into {self._cargo_output} but no {LIBRARY} is "
                "there (core/Cargo.toml's crate-type must include cdylib)"
            )
        if self.inplace:
            package = ROOT / "python" / "equarx"
        else:
            build_lib = self.get_finalized_command("build_ext").build_lib
            package = pathlib.Path(build_lib) / "equarx"
        package.mkdir(parents=True, exist_ok=True)
        dest = package / LIBRARY
        shutil.copyfile(library, dest)
        dest.chmod(0o755)
        # The release profile keeps line tables (for backtraces in
        # benchmarks); the wheel does without them, as for the CLI.
        try:
            subprocess.run(["strip", "-S", str(dest)], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"setup.py: {dest} left unstripped ({e})")


class bdist_wheel_any_python(bdist_wheel):
    """``py3-none-<platform>``: a ctypes library and an executable work
    under every Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform

    def run(self):
        # setuptools keeps its build/lib between builds, files deleted from
        # the tree since included: a wheel holds what the tree holds now.
        shutil.rmtree(self.get_finalized_command("build").build_lib, ignore_errors=True)
        super().run()


setup(
    version=core_version(),
    packages=["equarx"],
    package_dir={"": "python"},
    package_data={"equarx": ["py.typed"]},
    rust_extensions=[
        RustBin("equarx", path="Cargo.toml", cargo_manifest_args=["--locked"], strip=Strip.Debug),
    ],
    cmdclass={"build_rust": build_rust_and_library, "bdist_wheel": bdist_wheel_any_python},
    options={"build": {"build_base": str(BUILD)}, "egg_info": {"egg_base": str(BUILD)}},
    zip_safe=False,
)
