"""The package list; everything else is in pyproject.toml.

A folder mapped to an import name in pyproject's [tool.setuptools.package-dir] (shaders/ ->
`istanbul.shaders`) installs with all its subpackages under that name; setuptools' own
`packages.find` cannot prefix a folder's packages, so this file finds them. A new kernel
family folder is picked up without editing anything here.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
TOP_LEVEL = ["istanbul", "tokenizer_svc", "trainer_svc"]   # folders installed under their own name

with open(HERE / "pyproject.toml", "rb") as f:
    mapped = tomllib.load(f)["tool"]["setuptools"]["package-dir"]

packages = find_packages(str(HERE), include=[p for top in TOP_LEVEL for p in (top, f"{top}.*")])
for name, folder in mapped.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]

setup(packages=packages)
