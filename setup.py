"""Packages, found rather than listed: everything under syncviz/, plus kernels/ and dashboard/
installed as syncviz.kernels and syncviz.dashboard (nothing generic lands in site-packages).
Metadata is in pyproject.toml."""
from setuptools import find_packages, setup

ROOTS = {"syncviz": "syncviz", "syncviz.kernels": "kernels", "syncviz.dashboard": "dashboard"}
packages, package_dir = [], {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

# gradstamp.cpp is built on the user's machine against their torch (syncviz/record/native)
setup(packages=sorted(packages), package_dir=package_dir,
      package_data={"syncviz.record.native": ["*.cpp"]}, include_package_data=True)
