"""Parity generators: run the authors' public code on fixed inputs and record the numbers fedstyle's
``reference_code`` mode must reproduce (see README.md beside this file)."""
