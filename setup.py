"""Everything about the package is in pyproject.toml; this file only ships `ablate_lm_eval_plugin.pth` into
site-packages (setuptools has no setting for a file there), for `lm_eval --model ablate` (see
src/_ablate_lm_eval_plugin.py). MANIFEST.in puts the .pth in the sdist."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "ablate_lm_eval_plugin.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH))  # a wheel's root: site-packages
        if self.editable_mode:
            # An editable wheel holds only what lands in its own folder, the install command's install_lib (a
            # setuptools detail, checked by tests/test_packaging.py), so the .pth is copied there too.
            folder = self.distribution.get_command_obj("install").install_lib
            self.copy_file(os.path.join("src", PTH), os.path.join(folder, PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
