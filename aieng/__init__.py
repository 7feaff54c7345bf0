"""aieng: serve a language model the way production demands, and teach how.

The package is laid out along the path of one request (see DESIGN.md):
``store`` and ``loading`` get verified weights into memory, ``server`` takes HTTP in,
and ``demo`` / ``evaluation`` make and grade the offline demo model everything runs on.
"""

__version__ = "0.1.0"
