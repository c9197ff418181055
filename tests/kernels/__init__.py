# pytest imports this directory as the package `kernels` (prepend import mode: tests/ is
# the base directory), which shadows the project's `kernels` package; without the line
# below, `kernels.<module>` resolved through the editable install to whichever checkout
# was installed, not to the code beside these tests.
import os as _os

__path__.append(_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))), "kernels"))
