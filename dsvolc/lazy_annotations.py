"""The providers' SDKs imported with postponed annotations (PEP 563), for the offline commands.

pulumi_kubernetes' and pulumi_volcengine's generated modules spell out a type annotation for
every argument of every input and output type, and Python evaluates each one when the
module runs: `core.v1` alone builds about 100,000 `typing` objects (`Optional[Input[...]]`,
`NotRequired[...]`, TypedDict checks) that nothing in a preview reads. Compiled as if they
began with `from __future__ import annotations`, the annotations stay strings until
something asks for them, and the SDK asks only through `typing.get_type_hints` with the
module's globals (`pulumi._types`), which resolves the strings to the same types. A
preview's JSON is the same either way (tests/test_lazy_annotations.py compares every
shipped stack); `pulumi_kubernetes`' import went from about 0.55 to 0.28 s of CPU
(docs/preview.md).

Only `dsvolc preview` and `dsvolc manifests` install the finder (`install()`), before
anything imports a provider SDK; the program Pulumi's own CLI runs imports them as usual.
The bytecode is cached apart from Python's own `__pycache__` (the same source compiled
with another flag must not be picked up by a plain import): under
`$DSVOLC_CACHE_DIR` or `$XDG_CACHE_HOME/dsvolc` (default `~/.cache/dsvolc`), checked
against the source's mtime and size and the interpreter's magic number as Python checks
its own. An unwritable cache only costs the compile. `DSVOLC_PLAIN_IMPORTS=1` turns the
finder off.
"""

from __future__ import annotations

import __future__
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import sys
from pathlib import Path

PACKAGES = ("pulumi_kubernetes", "pulumi_volcengine", "pulumi_random")
_FLAGS = __future__.annotations.compiler_flag
_HEADER = 32  # magic (4) + flags tag (4) + mtime_ns (16) + size (8)
_TAG = b"p563"


def cache_dir() -> Path:
    if os.environ.get("DSVOLC_CACHE_DIR"):
        return Path(os.environ["DSVOLC_CACHE_DIR"]) / "pep563"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsvolc" / "pep563"


def _cache_file(source: str) -> Path:
    digest = hashlib.sha1(os.path.abspath(source).encode()).hexdigest()[:20]
    return cache_dir() / sys.implementation.cache_tag / f"{Path(source).stem}-{digest}.pyc"


def _header(st: os.stat_result) -> bytes:
    return (importlib.util.MAGIC_NUMBER + _TAG + st.st_mtime_ns.to_bytes(16, "little")
            + st.st_size.to_bytes(8, "little"))


class PostponedAnnotationsLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose code objects are compiled with PEP 563's flag."""

    def get_code(self, fullname):
        source = self.get_filename(fullname)
        st = os.stat(source)
        header = _header(st)
        cached = _cache_file(source)
        try:
            data = cached.read_bytes()
        except OSError:
            data = b""
        if data[:_HEADER] == header:
            try:
                return marshal.loads(data[_HEADER:])
            except (EOFError, ValueError, TypeError):
                pass  # a torn or foreign file: compile again
        code = compile(self.get_data(source), source, "exec", flags=_FLAGS, dont_inherit=True)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(header + marshal.dumps(code))
            os.replace(tmp, cached)
        except OSError:
            pass
        return code


class PostponedAnnotationsFinder:
    """Finds the provider SDKs' modules as the path finder does, with the loader above."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = PostponedAnnotationsLoader(spec.loader.name, spec.loader.path)
        return spec

    @classmethod
    def invalidate_caches(cls):
        pass


def install() -> bool:
    """Put the finder first on sys.meta_path (once). False when turned off by the
    environment or a provider SDK is already imported (its modules would mix both ways)."""
    if os.environ.get("DSVOLC_PLAIN_IMPORTS") == "1":
        return False
    if PostponedAnnotationsFinder in sys.meta_path:
        return True
    if any(name.partition(".")[0] in PACKAGES for name in sys.modules):
        return False
    sys.meta_path.insert(0, PostponedAnnotationsFinder)
    return True


def installed() -> bool:
    return PostponedAnnotationsFinder in sys.meta_path
