"""Browser tests of the built book (a package, so its conftest does not shadow tests/conftest.py)."""
