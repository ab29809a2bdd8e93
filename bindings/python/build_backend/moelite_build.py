"""The package's build backend (PEP 517), in the tree: it needs nothing but the standard library, so
`pip install ./bindings/python` works offline with any Python >= 3.9 and its pip, whether or not
setuptools and wheel are installed (pip's isolated build environment stays empty: requires = []).

The package is pure Python; a libmoelite.so* copied into moelite/ before building is packed with
it (the wheel is then tagged for this platform) and found at import time (moelite/_lib.py)."""
import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bindings/python
PACKAGE = "moelite"


def _project():
    """name, version, summary and requires-python from pyproject.toml's [project] table (a small
    reader: tomllib is Python 3.11+)."""
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def field(key):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), project, re.M)
        if not m:
            raise RuntimeError("pyproject.toml: [project] has no %s" % key)
        return m.group(1)

    return field("name"), field("version"), field("description"), field("requires-python")


def _package_files():
    """(path in the archive, file on disk) of the package: its modules and any library copied in."""
    out = []
    pkg = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name.startswith("libmoelite.so") or name.endswith((".dylib", ".dll")):
            out.append(("%s/%s" % (PACKAGE, name), os.path.join(pkg, name)))
    return out


def _metadata():
    name, version, summary, requires_python = _project()
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    return name, version, ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n"
                           "Provides-Extra: numpy\nRequires-Dist: numpy; extra == \"numpy\"\n"
                           "Description-Content-Type: text/markdown\n\n%s" % (name, version, summary, requires_python,
                                                                              readme))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _write_wheel(wheel_directory, files):
    name, version, metadata = _metadata()
    native = any(arc.endswith((".so", ".dylib", ".dll")) or ".so." in arc for arc, _ in files)
    tag = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_") if native else "py3-none-any"
    wheel_name = "%s-%s-%s.whl" % (name, version, tag)
    dist_info = "%s-%s.dist-info" % (name, version)
    entries = [(arc, open(path, "rb").read()) for arc, path in files]
    entries.append((dist_info + "/METADATA", metadata.encode("utf-8")))
    entries.append((dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: moelite_build\nRoot-Is-Purelib: %s\n"
                                           "Tag: %s\n" % ("false" if native else "true", tag)).encode()))
    record = []
    for arc, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
    record.append(dist_info + "/RECORD,,")
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode()))
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(arc, data)
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth file puts this checkout's bindings/python on sys.path."""
    name, version, _ = _metadata()
    pth = os.path.join(wheel_directory, "_%s_editable.pth" % name)
    with open(pth, "w") as f:
        f.write(HERE + "\n")
    try:
        return _write_wheel(wheel_directory, [("_%s_editable.pth" % name, pth)])
    finally:
        os.remove(pth)


def build_sdist(sdist_directory, config_settings=None):
    name, version, metadata = _metadata()
    base = "%s-%s" % (name, version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/moelite_build.py"] + [a for a, _ in _package_files()]:
            tar.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        data = metadata.encode("utf-8")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base + ".tar.gz"
